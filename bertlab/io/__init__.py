"""Files: locating model folders and the bundled checkpoint, atomic writes, checkpoints in and
out (one key table, safe loading), export. Imports only ``bertlab.nn`` (to build the models it
loads)."""
