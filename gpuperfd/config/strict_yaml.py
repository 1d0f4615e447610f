"""YAML as gpuperfd reads its own files: a key given twice in one mapping is an error, not "the last wins".

PyYAML's loaders keep the last of two equal keys silently, so ``probes:`` written twice (one block
pasted below another) dropped the first block's settings without a word (issue 52). Every file the
operator writes for gpuperfd (the daemon's config, ``probe --config``, the web config) is read here;
the error names the key and both lines. The C parser is used where PyYAML has libyaml (a large file
parses several times faster); the mapping check is the same Python either way.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["AliasBomb", "DuplicateKeyError", "MAX_EXPANDED_VALUES", "MAX_FILE_BYTES", "read_bounded",
           "safe_load_strict"]

_Base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names a key twice; the message says which and where (1-based lines)."""


class _StrictLoader(_Base):  # type: ignore[misc, valid-type]
    """SafeLoader that refuses a key given twice in one mapping (merge keys ``<<`` keep their meaning)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class says so
                break
            if first is not None:
                raise DuplicateKeyError(
                    None, None,
                    f"key {key!r} is given twice in one mapping (line {first.line + 1} and line "
                    f"{key_node.start_mark.line + 1}); keep one", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


#: The most bytes of a file of gpuperfd's read (a config is a few KiB; a fleet's tens).
MAX_FILE_BYTES = 4 * 2**20


def read_bounded(path: str | Any, limit: int = MAX_FILE_BYTES) -> bytes:
    """The file's bytes; ValueError past ``limit`` (``/dev/zero`` or an endless pipe is never read to its end).
    OSError as ``open`` raises it."""
    with open(path, "rb") as handle:
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"more than {limit // 2**20} MiB is not a gpuperfd file (one is a few KiB): is this the "
                         "right file?")
    return raw


#: The most values a file may hold with its aliases expanded (a config has hundreds; a fleet's thousands).
MAX_EXPANDED_VALUES = 100_000


class AliasBomb(yaml.YAMLError):
    """Aliases expand the document past :data:`MAX_EXPANDED_VALUES` (a "billion laughs" file)."""


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` stands for with every alias expanded, each shared node counted once per
    use (memoized by node, so the walk itself is linear in the file)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    sizes[id(node)] = 1  # a recursive alias counts once (the constructor refuses or builds it as it can)
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
    sizes[id(node)] = total
    return total


def safe_load_strict(stream: str | bytes | Any) -> Any:
    """``yaml.safe_load`` that raises :class:`DuplicateKeyError` for a key given twice in one mapping and
    :class:`AliasBomb` for aliases that expand a small file into millions of values (issue 61: a billion
    laughs file's error message ran to 2 MB as every layer of the expansion was printed)."""
    loader = _StrictLoader(stream)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if (size := _expanded_size(node, {})) > MAX_EXPANDED_VALUES:
            raise AliasBomb(f"its aliases (*name) expand it to {size:,} values, more than the "
                            f"{MAX_EXPANDED_VALUES:,} any gpuperfd file holds (a 'billion laughs' document?)")
        return loader.construct_document(node)
    finally:
        loader.dispose()
