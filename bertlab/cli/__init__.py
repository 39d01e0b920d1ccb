"""``bertlab <verb>``: each command parses its arguments, makes one call and prints the result.
The top of the house: imports anything, imported by nothing but ``python -m bertlab``."""
