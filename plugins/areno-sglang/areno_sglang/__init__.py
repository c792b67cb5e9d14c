"""areno-sglang: the ``sglang`` rollout engine for areno (``--rollout-engine sglang``)."""

from areno_sglang.client import SGLangClient, SGLangServerError, StaleWeightsError
from areno_sglang.config import SGLangEngineConfig
from areno_sglang.engine import SGLangEngine, create_sglang_engine

__version__ = "0.1.0"

__all__ = [
    "SGLangClient",
    "SGLangEngine",
    "SGLangEngineConfig",
    "SGLangServerError",
    "StaleWeightsError",
    "create_sglang_engine",
]
