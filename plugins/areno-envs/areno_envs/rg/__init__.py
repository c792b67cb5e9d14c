"""reasoning-gym tasks as areno loaders, a reward and ``rg/<task>`` recipes."""
