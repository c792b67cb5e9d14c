"""verifiers environments (the ``verifiers.v1`` API) as areno loaders, rewards and an agent."""
