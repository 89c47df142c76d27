"""The Flame path: a Flame service that embeds the engine, and the client that batches prompts into tasks."""
