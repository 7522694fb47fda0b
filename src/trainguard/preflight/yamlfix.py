"""`check --fix` on a YAML config: the changes made on the file's own text, so its comments, key order,
quoting and indentation stay as the user wrote them (a plain dump of the parsed data would drop every
comment, which is often where a config explains itself).

ruamel.yaml reads the file as a round-trip document; each change sets one dotted key, creating the
mappings on its way when the key was missing; the document is written back with the indentation the
file used.
"""

from __future__ import annotations

import io
from typing import Any

from trainguard.errors import UserError


def rewrite(text: str, changes: list[tuple[str, Any]]) -> str:
    """`text` with each (dotted key, new value) set; everything else as it was."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.util import load_yaml_guess_indent

    try:
        _, indent, block_seq_indent = load_yaml_guess_indent(text)
    except YAMLError as exc:  # stricter than the reader (a duplicate key): one line, not a traceback
        problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
        raise UserError(f"--fix cannot rewrite this YAML keeping its layout: {problem}") from None
    yaml = YAML()  # round-trip: comments and order are part of the loaded document
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap a long line the user wrote
    yaml.indent(mapping=indent or 2, sequence=(indent or 2) + (block_seq_indent or 0), offset=block_seq_indent or 0)
    try:
        data = yaml.load(text)
    except YAMLError as exc:  # stricter than the reader (a duplicate key): one line, not a traceback
        problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
        raise UserError(f"--fix cannot rewrite this YAML keeping its layout: {problem}") from None
    for dotted, value in changes:
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            if part not in node:
                node[part] = CommentedMap()
            node = node[part]
        node[last] = value
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()
