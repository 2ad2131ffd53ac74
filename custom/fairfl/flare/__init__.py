"""FLARE components: the client executor and the server controllers (thin; the math lives in fairfl)."""

from fairfl.compat import serialize_ast_parse

serialize_ast_parse()  # every FLARE process that loads our components decodes arrays in threads
