"""The scripted model: a deterministic OpenAI-compatible chat server (see `scripted_model.server`)."""
