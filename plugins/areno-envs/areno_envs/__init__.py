"""areno-envs: the field's environment libraries as areno recipes (reasoning-gym, verifiers)."""
