"""RabbitMQ's list query parameters: ``page``, ``page_size``, ``name``, ``use_regex``,
``sort``, ``sort_reverse``, ``columns`` (rabbit_mgmt_util's semantics). Pure.

Without ``page`` a list comes back as a plain JSON array, sorted and filtered; with it, an
object: ``items``, ``page``, ``page_count``, ``page_size``, ``filtered_count``,
``total_count``, ``item_count``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500


class BadRequest(ValueError):
    """A 400 with this reason."""


def truthy(value: Any) -> bool:
    """RabbitMQ's booleans in JSON and query strings: true, "true" (any case); else false."""
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)


def lookup(item: Mapping[str, Any], path: str) -> Any:
    """A dotted column: ``message_stats.publish_details.rate``; None when missing."""
    value: Any = item
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _sort_key(value: Any) -> tuple[int, Any]:
    # None first, then numbers, then strings (a mixed column still sorts).
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, int | float):
        return (1, value)
    return (2, str(value))


def pick_columns(item: Mapping[str, Any], columns: list[str]) -> dict[str, Any]:
    """Keep only ``columns`` (dotted paths keep the nesting)."""
    out: dict[str, Any] = {}
    for column in columns:
        parts = column.split(".")
        value = lookup(item, column)
        if value is None and lookup(item, parts[0]) is None and parts[0] not in item:
            continue
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _int(params: Mapping[str, str], name: str, default: int) -> int:
    text = params.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise BadRequest(f"{name} must be an integer: {text!r}") from None


def apply(items: list[dict[str, Any]], params: Mapping[str, str],
          default_sort: str | None = "name") -> list[dict[str, Any]] | dict[str, Any]:
    """Filter, sort, page and pick columns of ``items`` as RabbitMQ's list endpoints do."""
    total = len(items)
    name = params.get("name")
    if name:
        if truthy(params.get("use_regex", "false")):
            try:
                pattern = re.compile(name)
            except re.error as exc:
                raise BadRequest(f"bad regex {name!r}: {exc}") from None
            items = [i for i in items if pattern.search(str(i.get("name", "")))]
        else:
            needle = name.lower()
            items = [i for i in items if needle in str(i.get("name", "")).lower()]
    sort = params.get("sort") or default_sort
    reverse = truthy(params.get("sort_reverse", "false"))
    if sort:
        keys = [s for s in sort.split(",") if s]
        items = sorted(items, key=lambda i: [_sort_key(lookup(i, k)) for k in keys], reverse=reverse)
    elif reverse:
        items = list(reversed(items))
    columns = [c for c in params.get("columns", "").split(",") if c]
    page_text = params.get("page")
    if page_text is None:
        return [pick_columns(i, columns) for i in items] if columns else items
    page = _int(params, "page", 1)
    page_size = _int(params, "page_size", DEFAULT_PAGE_SIZE)
    if page_size < 1 or page_size > MAX_PAGE_SIZE:
        raise BadRequest(f"page_size must be between 1 and {MAX_PAGE_SIZE}: {page_size}")
    filtered = len(items)
    page_count = max(1, math.ceil(filtered / page_size))
    if page < 1 or page > page_count:
        raise BadRequest("page_out_of_range")
    chunk = items[(page - 1) * page_size: page * page_size]
    if columns:
        chunk = [pick_columns(i, columns) for i in chunk]
    return {
        "filtered_count": filtered,
        "item_count": len(chunk),
        "items": chunk,
        "page": page,
        "page_count": page_count,
        "page_size": page_size,
        "total_count": total,
    }
