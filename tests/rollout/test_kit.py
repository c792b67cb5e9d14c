"""areno_core.rollout.kit: completion texts decode to what the tokenizer's batch_decode gives."""

from __future__ import annotations

from areno_core.models.tokenizer import build_byte_tokenizer
from areno_core.rollout.kit import _plain_backend, decode_texts

BODIES = [
    list(b"12+7=19"),
    [],
    [*"é€".encode(), 258, 32, 256],  # multi-byte characters, then special tokens (kept)
    list("é".encode())[:1],  # half a character
]


def test_decode_texts_equals_batch_decode_through_the_backend():
    tokenizer = build_byte_tokenizer()
    assert _plain_backend(tokenizer) is tokenizer.backend_tokenizer
    texts = decode_texts(tokenizer, BODIES)
    assert texts == tokenizer.batch_decode(BODIES, skip_special_tokens=False)
    assert texts[0] == "12+7=19" and texts[1] == ""


def test_decode_texts_falls_back_where_batch_decode_does_more():
    tokenizer = build_byte_tokenizer()
    tokenizer.clean_up_tokenization_spaces = True  # a clean-up step after the backend
    assert _plain_backend(tokenizer) is None
    assert decode_texts(tokenizer, BODIES) == tokenizer.batch_decode(BODIES)

    class Shouting(type(build_byte_tokenizer())):
        def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return super()._decode(token_ids, skip_special_tokens, **kwargs).upper()

    shouting = build_byte_tokenizer()
    shouting.__class__ = Shouting
    assert _plain_backend(shouting) is None
    assert decode_texts(shouting, BODIES[:1]) == ["12+7=19".upper()]
