"""Looking inside a model: the parameter table (``bertlab summary``) and the embedding layer
taken apart (``bertlab inspect embeddings``). Imports the network; nothing imports it but the
commands."""
