"""Reading a recipe's YAML safely: safe types only, and bounded however it is written.

YAML aliases (`&name` ... `*name`) let a few hundred bytes name billions of values (an
"alias bomb"); `parse_yaml` measures a document with its aliases expanded, without
expanding them, and refuses one past `MAX_YAML_NODES` values before building it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from inferchain.errors import ConfigError, cut_message

MAX_YAML_NODES = 100_000  # values in a recipe once its aliases are expanded, at most


def parse_yaml(text: str, source: Path) -> Any:
    """The YAML document in `text` (safe types only), refused when its aliases expand it
    past `MAX_YAML_NODES` values (an alias bomb: a few hundred bytes naming billions)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_YAML_NODES:
            raise ConfigError(
                f"{source}: its YAML aliases (*name) expand it to more than {MAX_YAML_NODES} "
                "values; a recipe is small: write the values out, or alias fewer of them"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {cut_message(str(e))}") from None
    except RecursionError:
        raise ConfigError(f"{source}: not a recipe (its YAML is nested too deeply)") from None
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Values under `node` with every alias expanded; each shared node is measured once
    (`sizes`), so this costs the nodes written, not the values they expand to."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    sizes[id(node)] = MAX_YAML_NODES + 1  # a node that holds itself expands for ever
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
    sizes[id(node)] = size = min(size, MAX_YAML_NODES + 1)
    return size
