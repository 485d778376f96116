"""The validator of a tool's inputSchema: agents' arguments judged in time linear in their size.

The gateway refuses arguments that break the tool's inputSchema before it accepts or charges the
call (422). The schema comes from the upstream, the arguments from the agent, so the agent must not
be able to choose arguments that make validation slow. jsonschema's engine is not linear:
``uniqueItems`` falls back to comparing every pair of items that do not sort (8,000 mixed strings
and integers held a worker for 15 s), a recursive schema with ``anyOf``/``oneOf``/``allOf``/``if``
validates the same value once per branch at each level (exponential in the depth the agent
chooses), a ``$ref`` cycle that does not descend into the value never ends, and its ``pattern``
keywords run on Python's backtracking ``re`` (``^(a+)+$`` against 41 characters: minutes).

Here a schema is compiled once (``schema_compile``) into a tree of checks:

* each (schema node, value) pair is judged at most once per call (a memo over containers, and over
  every value for schema nodes reached from more than one place), so the work is linear in the
  arguments for a given schema;
* ``uniqueItems``, ``enum`` and ``const`` compare values through a canonical form computed once per
  value (JSON Schema equality: ``1 == 1.0``, ``true != 1``, objects unordered);
* ``pattern`` and ``patternProperties`` run on RE2 (``google-re2``), which matches in linear time;
* every call is held to bounds checked before validating (``max_nodes`` values, ``max_items`` per
  array or object, by a walk that stops at the first bound passed) and to a budget of steps counted
  while validating (``max_steps``); past any of them the arguments are refused as too large or too
  complex, never judged slowly;
* one pass answers: valid, or the first error found, with its path.

That is the memo validator: linear, but Python (about 1 µs a step). A schema whose work per value is
bounded when it is compiled (``_why_slow``: not recursive, at most ``FAST_PATHS`` schema paths, none of
the keywords jsonschema-rs does not judge in linear work or judges otherwise) is judged by jsonschema-rs
instead (Rust, its linear regex engine, formats off), within ``FAST_WORK`` per call; the memo validator
judges the rest and the calls jsonschema-rs cannot judge exactly (docs/decisions.md, "Receipts and the
governed call").

A schema the gateway cannot use this way is unusable (``SchemaUnusable``, with the reason): an
unknown ``$schema``, one the metaschema rejects, a ``$ref`` that is not local, does not resolve, or
cycles without descending into the arguments, a pattern RE2 cannot compile (backreferences,
lookaround), or a keyword implemented nowhere here (``unevaluatedProperties``,
``unevaluatedItems``, ``$dynamicRef``, ``$recursiveRef``). The tool of such a schema is refused
(docs/decisions.md, "Receipts and the governed call"), never left to fail in the middle of a call.
Annotations (``title``, ``description``, ``default``, ``format``...) are ignored, as jsonschema
ignores them by default.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache, partial
from typing import Any
from urllib.parse import unquote

import jsonschema  # type: ignore[import-untyped]  # no stubs in the environment
import jsonschema_rs
import re2  # type: ignore[import-untyped]  # no stubs in the environment

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # an unsupported pattern is an answer here, not a line on stderr

# The ``$schema`` names understood, without their empty fragment; no ``$schema``: 2020-12.
DRAFTS = {
    "https://json-schema.org/draft/2020-12/schema": 2020,
    "https://json-schema.org/draft/2019-09/schema": 2019,
    "http://json-schema.org/draft-07/schema": 7,
    "http://json-schema.org/draft-06/schema": 6,
    "http://json-schema.org/draft-04/schema": 4,
}
_METASCHEMA_VALIDATORS = {
    2020: jsonschema.Draft202012Validator,
    2019: jsonschema.Draft201909Validator,
    7: jsonschema.Draft7Validator,
    6: jsonschema.Draft6Validator,
    4: jsonschema.Draft4Validator,
}
# Keywords that change validation and that this validator does not implement, by the drafts defining them.
_UNSUPPORTED = {
    "unevaluatedProperties": 2019,
    "unevaluatedItems": 2019,
    "$recursiveRef": 2019,
    "$dynamicRef": 2020,
}

# What an error says of a value: its repr, cut short (a message never costs the size of the arguments).
BRIEF_LENGTH = 80

# The engines (docs/decisions.md, "Receipts and the governed call"). jsonschema-rs judges a schema whose
# work per value is bounded when it is compiled: no cycle through $ref, at most FAST_PATHS schema paths
# from the root (so at most that many schema nodes apply to any one value), no uniqueItems (its hash of
# an array has no length delimiters, so distinct items collide and the set turns quadratic: 4,000 nested
# empty arrays, 110 KB, took 0.5 s), no enum it would scan value by value past FAST_ENUM_SCAN, and no
# pattern whose classes its regex engine reads differently from RE2. The memo validator judges the rest.
FAST = "jsonschema-rs"
MEMO = "memo"
FAST_PATHS = 256
# jsonschema-rs judges a call when its schema paths times the values of the arguments are at most this:
# about 20-50 ns a (schema node, value) pair on this host, so 20-50 ms at most; past it, the memo
# validator and its step budget (a fan-out of 256 paths over 10,000 values: 120 ms on jsonschema-rs).
FAST_WORK = 1_000_000
FAST_ENUM_SCAN = 64
# Escapes the two regex engines read differently: \s (Rust follows ECMA-262 and matches U+00A0, RE2 does
# not), \b and \B (Rust's word boundary is Unicode, RE2's ASCII), \p and \P (Unicode classes), and
# POSIX classes; a pattern with one of them keeps its schema on RE2.
_DIFFERING_ESCAPES = ("\\s", "\\S", "\\b", "\\B", "\\p", "\\P", "[:")
_FAST_VALIDATORS: dict[int, Any] = {
    2020: jsonschema_rs.Draft202012Validator,
    2019: jsonschema_rs.Draft201909Validator,
    7: jsonschema_rs.Draft7Validator,
    6: jsonschema_rs.Draft6Validator,
    4: jsonschema_rs.Draft4Validator,
}


class SchemaUnusable(Exception):
    """The schema cannot be used to validate arguments; ``str()`` says why."""


class _OverBudget(Exception):
    """The call's step budget ran out."""


@dataclass(frozen=True)
class ArgumentError:
    """Why arguments are refused: where (``path`` into the arguments), what, and the 422's ``type``."""

    path: tuple[str | int, ...]
    message: str
    type: str  # invalid_arguments, arguments_too_large or arguments_too_complex


@dataclass(frozen=True)
class Verdict:
    """One validation: ``error`` None when the arguments are valid; ``steps`` the work the memo validator
    counted (0 when jsonschema-rs judged: its work is bounded by the schema); ``engine`` the one that judged."""

    error: ArgumentError | None
    steps: int
    engine: str = MEMO


def brief(value: Any) -> str:
    """``repr(value)`` up to ``BRIEF_LENGTH`` characters, computed in time bounded by that length."""
    out: list[str] = []
    budget = [BRIEF_LENGTH]

    def emit(text: str) -> bool:
        out.append(text[: budget[0]])
        budget[0] -= len(text)
        return budget[0] > 0

    def walk(v: Any) -> bool:
        t = type(v)
        if t is dict:
            if not emit("{"):
                return False
            for i, (k, item) in enumerate(v.items()):
                if (i and not emit(", ")) or not walk(k) or not emit(": ") or not walk(item):
                    return False
            return emit("}")
        if t is list:
            if not emit("["):
                return False
            for i, item in enumerate(v):
                if (i and not emit(", ")) or not walk(item):
                    return False
            return emit("]")
        if t is str and len(v) > BRIEF_LENGTH:
            v = v[:BRIEF_LENGTH]
        return emit(repr(v))

    if walk(value):
        return "".join(out)
    return "".join(out) + "..."


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    """The RE2 program of ``pattern``, or None when RE2 cannot compile it."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error:
        return None


def _pattern_differs(pattern: str) -> str:
    """Why jsonschema-rs's regex engine may judge ``pattern`` differently from RE2 ("" when it may not)."""
    for escape in _DIFFERING_ESCAPES:
        if escape in pattern:
            return f"the pattern {brief(pattern)} uses {escape}, read differently by the two regex engines"
    return ""


def _regex(pattern: str) -> Any:
    program = _compiled(pattern)
    if program is None:
        raise SchemaUnusable(f"the pattern {brief(pattern)} cannot run on RE2 (backreferences or lookaround)")
    return program


# --- the run: one validation of one instance ----------------------------------------------------------

_Error = tuple[tuple[str | int, ...], Any]  # path, message (a callable: rendered only for the error answered)


def _say(template: str, *values: Any) -> str:
    """``template`` with each ``{}`` replaced by the brief repr of a value (an error message, when answered)."""
    return template.format(*(brief(v) for v in values))


def _literal(text: str) -> str:
    """``text`` as a literal part of a ``_say`` template."""
    return text.replace("{", "{{").replace("}", "}}")


def _text(message: Any) -> str:
    return str(message()) if callable(message) else str(message)


_Check = Callable[[Any, "_Run"], "_Error | None"]


class _Run:
    """The state of one validation: the memo of verdicts, canonical forms and the step counter."""

    __slots__ = ("canon_ids", "consts", "interned", "max_steps", "memo", "steps")

    def __init__(self, max_steps: int) -> None:
        self.memo: dict[tuple[int, int], _Error | None] = {}
        self.canon_ids: dict[int, tuple[str, int]] = {}
        self.interned: dict[Any, int] = {}
        self.consts: dict[int, Any] = {}
        self.steps = 0
        self.max_steps = max_steps

    def count(self, n: int) -> None:
        self.steps += n
        if self.steps > self.max_steps:
            raise _OverBudget

    def canon(self, value: Any) -> Any:
        """A hashable key equal for JSON-equal values: containers interned once per run (linear)."""
        t = type(value)
        if t is list or t is dict:
            found = self.canon_ids.get(id(value))
            if found is not None:
                return found
            self.count(len(value))
            if t is list:
                key: Any = ("a", tuple([self.canon(item) for item in value]))
            else:
                key = ("o", frozenset([(k, self.canon(item)) for k, item in value.items()]))
            made = ("c", self.interned.setdefault(key, len(self.interned)))
            self.canon_ids[id(value)] = made
            return made
        return _scalar_key(value)


def _scalar_key(value: Any) -> Any:
    t = type(value)
    if t is bool:
        return ("b", value)
    if t is int or t is float:
        return ("n", value)  # Python: 1 == 1.0 and hash(1) == hash(1.0)
    if t is str:
        return ("s", value)
    return ("z",)


class _Node:
    """One compiled schema (a dict or a boolean): checks for any value, and checks per JSON type."""

    __slots__ = ("any", "by_type", "children", "index", "inplace", "ref", "shared", "slow", "trivial")

    def __init__(self, index: int) -> None:
        self.index = index
        self.any: list[_Check] = []
        self.by_type: dict[type, list[_Check]] = {}
        self.inplace: list[_Node] = []  # nodes applied to the same value (allOf, $ref...): must not cycle
        self.ref: list[_Node] = []  # the target of its $ref, once resolved
        self.children: list[_Node] = []  # nodes applied to the values inside it (items, properties...)
        self.slow = ""  # why jsonschema-rs must not judge a schema holding this node ("" if it may)
        self.shared = False  # reached from more than one place: its verdicts on scalars are memoized too
        self.trivial = False

    def finish(self) -> None:
        self.trivial = not self.any and not any(self.by_type.values())


def _judge(node: _Node, value: Any, run: _Run) -> _Error | None:
    """The verdict of ``node`` on ``value``: each (node, container) pair at most once per run."""
    if node.trivial:
        return None
    t = type(value)
    memoize = t is dict or t is list or node.shared
    if memoize:
        key = (node.index, id(value))
        memo = run.memo
        if key in memo:
            run.steps += 1
            return memo[key]
    run.steps += 1
    if run.steps > run.max_steps:
        raise _OverBudget
    error = None
    for check in node.any:
        error = check(value, run)
        if error is not None:
            break
    else:
        for check in node.by_type.get(t, ()):
            error = check(value, run)
            if error is not None:
                break
    if memoize:
        memo[key] = error
    return error


def _under(key: str | int, error: _Error) -> _Error:
    return ((key, *error[0]), error[1])


_NUMBERS = (int, float)
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
    "number": _NUMBERS,
    "integer": (int,),
}


# The keywords that bound the length of a value, by its type: (keyword, whether it is a lower bound, what
# the error message says of a value outside it).
_LENGTH_KEYWORDS: dict[type, tuple[tuple[str, bool, str], ...]] = {
    str: (("minLength", True, "is too short"), ("maxLength", False, "is too long")),
    list: (("minItems", True, "is too short"), ("maxItems", False, "is too long")),
    dict: (("minProperties", True, "has too few properties"), ("maxProperties", False, "has too many properties")),
}


# --- the compiler -------------------------------------------------------------------------------------


class _Compiler:
    """Compiles one schema document; local ``$ref`` resolved by JSON pointer or anchor."""

    def __init__(self, root: Any, draft: int) -> None:
        self.root = root
        self.draft = draft
        self.nodes: list[_Node] = []
        self.by_id: dict[int, _Node] = {}
        self.anchors: dict[str, Any] = {}
        self.refs: list[tuple[_Node, str]] = []
        self.numbers = False  # multipleOf, or an enum or const holding a number (see _inexact)
        self.root_id = ""
        if isinstance(root, dict):
            rid = root.get("id" if draft == 4 else "$id")
            if isinstance(rid, str) and not rid.startswith("#"):
                self.root_id = rid.split("#", 1)[0]

    def node(self, schema: Any) -> _Node:
        if type(schema) is dict or type(schema) is bool:
            found = self.by_id.get(id(schema)) if type(schema) is dict else None
            if found is not None:
                found.shared = True
                return found
        else:
            raise SchemaUnusable(f"{brief(schema)} is not a schema")
        node = _Node(len(self.nodes))
        self.nodes.append(node)
        if schema is False:
            node.any.append(lambda value, run: ((), lambda: f"False schema does not allow {brief(value)}"))
        elif schema is not True:
            self.by_id[id(schema)] = node
            self._keywords(node, schema)
        node.finish()
        return node

    def _add(self, node: _Node, types: tuple[type, ...], check: _Check) -> None:
        for t in types:
            node.by_type.setdefault(t, []).append(check)

    def _lengths(self, node: _Node, s: dict[str, Any], kind: type) -> None:
        """The bounds on the length of a ``kind`` value (``_LENGTH_KEYWORDS``)."""
        for keyword, at_least, says in _LENGTH_KEYWORDS[kind]:
            if keyword in s:
                self._add(node, (kind,), _length_check(s[keyword], at_least=at_least, says=says))

    def _keywords(self, node: _Node, s: dict[str, Any]) -> None:
        draft = self.draft
        for keyword, since in _UNSUPPORTED.items():
            if keyword in s and draft >= since and not (keyword.startswith("unevaluated") and s[keyword] is True):
                raise SchemaUnusable(f"the keyword {keyword} is not supported")
        ident = s.get("id" if draft == 4 else "$id")
        if isinstance(ident, str) and s is not self.root:
            if ident.startswith("#") and draft <= 7:
                self.anchors[ident[1:]] = s
            elif ident not in ("", "#"):
                raise SchemaUnusable(f"an embedded $id ({brief(ident)}) is not supported")
        if draft >= 2019:
            for anchor in ("$anchor", "$dynamicAnchor"):
                if isinstance(s.get(anchor), str):
                    self.anchors[s[anchor]] = s
        for defs in ("$defs", "definitions"):  # compiled even when unused: a bad one is found now
            if isinstance(s.get(defs), dict):
                for sub in s[defs].values():
                    self.node(sub)

        if "$ref" in s:
            ref = s["$ref"]
            if not isinstance(ref, str):
                raise SchemaUnusable("a $ref that is not a string")
            self.refs.append((node, ref))
            node.any.append(_ref_check(node.ref))
            if draft <= 7:
                return  # siblings of $ref are ignored before 2019-09

        if "multipleOf" in s or _holds_number(s.get("enum")) or _holds_number(s.get("const")):
            self.numbers = True
        if "type" in s:
            names = s["type"] if isinstance(s["type"], list) else [s["type"]]
            allowed: set[type] = set()
            for name in names:
                allowed.update(_TYPES[name])
            integral = "integer" in names and "number" not in names and draft >= 6
            joined = ", ".join(repr(name) for name in names)

            def check_type(value: Any, run: _Run, allowed: set[type] = allowed, integral: bool = integral) -> Any:
                t = type(value)
                if t in allowed or (integral and t is float and value.is_integer()):
                    return None
                return ((), lambda: f"{brief(value)} is not of type {joined}")

            node.any.append(check_type)

        if "enum" in s:
            node.any.append(_equality_check(s["enum"], one_of=True))
            if len(s["enum"]) > FAST_ENUM_SCAN and not all(type(v) is str for v in s["enum"]):
                node.slow = f"an enum of more than {FAST_ENUM_SCAN} values that are not all strings"
        if "const" in s and draft >= 6:
            node.any.append(_equality_check([s["const"]], one_of=False))

        # numbers
        if "multipleOf" in s:
            self._add(node, _NUMBERS, _multiple_of(s["multipleOf"]))
            if type(s["multipleOf"]) is float:  # jsonschema-rs: about 3 us a number (a fraction each time)
                node.slow = "a multipleOf that is not an integer (jsonschema-rs's is several times slower)"
        for keyword, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            if keyword in s:  # draft 4: a boolean exclusiveMinimum/Maximum makes the bound exclusive
                self._add(
                    node, _NUMBERS, _bound(keyword, s[keyword], exclusive=draft == 4 and s.get(exclusive) is True)
                )
            if exclusive in s and draft >= 6:
                self._add(node, _NUMBERS, _bound(keyword, s[exclusive], exclusive=True))

        # strings
        self._lengths(node, s, str)  # len(): code points, as JSON Schema counts
        if "pattern" in s:
            self._add(node, (str,), _pattern_check(_regex(s["pattern"]), s["pattern"]))
            node.slow = node.slow or _pattern_differs(s["pattern"])

        # arrays
        self._arrays(node, s)
        # objects
        self._objects(node, s)

        # in place
        for keyword in ("allOf", "anyOf", "oneOf"):
            if keyword in s:
                branches = [self.node(sub) for sub in s[keyword]]
                node.inplace.extend(branches)
                node.any.append(_combinator(keyword, branches))
        if "not" in s:
            negated = self.node(s["not"])
            node.inplace.append(negated)

            def check_not(value: Any, run: _Run, negated: _Node = negated) -> Any:
                if _judge(negated, value, run) is None:
                    return ((), lambda: f"{brief(value)} should not be valid under the 'not' schema")
                return None

            node.any.append(check_not)
        if "if" in s and draft >= 7:
            condition = self.node(s["if"])
            then = self.node(s["then"]) if "then" in s else None
            otherwise = self.node(s["else"]) if "else" in s else None
            node.inplace.extend(n for n in (condition, then, otherwise) if n is not None)
            if then is not None or otherwise is not None:

                def check_if(value: Any, run: _Run, c: _Node = condition, t: Any = then, e: Any = otherwise) -> Any:
                    branch = t if _judge(c, value, run) is None else e
                    return None if branch is None else _judge(branch, value, run)

                node.any.append(check_if)

    def _arrays(self, node: _Node, s: dict[str, Any]) -> None:
        draft = self.draft
        items = s.get("items")
        prefix: list[_Node] = []
        rest: _Node | None = None
        if draft >= 2020:
            prefix = [self.node(sub) for sub in s.get("prefixItems", [])]
            if "items" in s:
                rest = self.node(items)
        elif isinstance(items, list):
            prefix = [self.node(sub) for sub in items]
            if "additionalItems" in s:
                rest = self.node(s["additionalItems"])
        elif "items" in s:
            rest = self.node(items)
        node.children.extend(prefix)
        if rest is not None:
            node.children.append(rest)
        if prefix or rest is not None:

            def check_items(value: list[Any], run: _Run, prefix: list[_Node] = prefix, rest: Any = rest) -> Any:
                for index, (item, sub) in enumerate(zip(value, prefix, strict=False)):
                    error = _judge(sub, item, run)
                    if error is not None:
                        return _under(index, error)
                if rest is not None:
                    for index in range(len(prefix), len(value)):
                        error = _judge(rest, value[index], run)
                        if error is not None:
                            return _under(index, error)
                return None

            self._add(node, (list,), check_items)
        if "contains" in s:
            contains = self.node(s["contains"])
            node.children.append(contains)
            least = s.get("minContains", 1) if draft >= 2019 else 1
            most = s.get("maxContains") if draft >= 2019 else None

            def check_contains(
                value: list[Any], run: _Run, c: _Node = contains, least: int = least, most: Any = most
            ) -> Any:
                matches = 0
                for item in value:
                    if _judge(c, item, run) is None:
                        matches += 1
                        if most is not None and matches > most:
                            return ((), lambda: f"Too many items match the given schema (expected at most {most})")
                if matches < least:
                    return (
                        (),
                        partial(_say, "{} does not contain enough items valid under the 'contains' schema", value),
                    )
                return None

            self._add(node, (list,), check_contains)
        self._lengths(node, s, list)
        if s.get("uniqueItems") is True:
            self._add(node, (list,), _unique)
            node.slow = "uniqueItems (jsonschema-rs hashes arrays so that distinct items can collide)"

    def _objects(self, node: _Node, s: dict[str, Any]) -> None:
        draft = self.draft
        properties = {name: self.node(sub) for name, sub in (s.get("properties") or {}).items()}
        patterns = [(_regex(p), self.node(sub)) for p, sub in (s.get("patternProperties") or {}).items()]
        pattern_names = list(s.get("patternProperties") or {})
        additional = s.get("additionalProperties")
        extra = self.node(additional) if additional is not None and additional is not False else None
        closed = additional is False
        node.children.extend(properties.values())
        node.children.extend(sub for _, sub in patterns)
        node.children.extend([extra] if extra is not None else [])
        for p in pattern_names:
            node.slow = node.slow or _pattern_differs(p)
        if properties or patterns or additional is not None:

            def check_properties(value: dict[str, Any], run: _Run) -> Any:
                run.count(len(value))
                for key, item in value.items():
                    sub = properties.get(key)
                    if sub is not None:
                        error = _judge(sub, item, run)
                        if error is not None:
                            return _under(key, error)
                    matched = False
                    for program, psub in patterns:
                        if program.search(key) is not None:
                            matched = True
                            error = _judge(psub, item, run)
                            if error is not None:
                                return _under(key, error)
                    if sub is None and not matched:
                        if closed:
                            if pattern_names:
                                listed = ", ".join(repr(p) for p in pattern_names)
                                return (
                                    (),
                                    partial(
                                        _say,
                                        "{} does not match any of the regexes: " + _literal(listed[:BRIEF_LENGTH]),
                                        key,
                                    ),
                                )
                            return ((), partial(_say, "Additional properties are not allowed ({} was unexpected)", key))
                        if extra is not None:
                            error = _judge(extra, item, run)
                            if error is not None:
                                return _under(key, error)
                return None

            self._add(node, (dict,), check_properties)
        if s.get("required") and isinstance(s["required"], list):
            required = list(s["required"])

            def check_required(value: dict[str, Any], run: _Run) -> Any:
                for name in required:
                    if name not in value:
                        return ((), partial(_say, "{} is a required property", name))
                return None

            self._add(node, (dict,), check_required)
        self._lengths(node, s, dict)
        if "propertyNames" in s and draft >= 6:
            names = self.node(s["propertyNames"])
            node.children.append(names)

            def check_names(value: dict[str, Any], run: _Run, names: _Node = names) -> Any:
                for key in value:
                    error = _judge(names, key, run)
                    if error is not None:
                        return (
                            (),
                            partial(_say, "property name {}: " + _literal(_text(error[1])), key),
                        )
                return None

            self._add(node, (dict,), check_names)
        needs: dict[str, list[str]] = {}
        schemas: dict[str, _Node] = {}
        if draft >= 2019:
            needs.update(s.get("dependentRequired") or {})
            schemas.update({name: self.node(sub) for name, sub in (s.get("dependentSchemas") or {}).items()})
        elif isinstance(s.get("dependencies"), dict):
            for name, dependency in s["dependencies"].items():
                if isinstance(dependency, list):
                    needs[name] = dependency
                else:
                    schemas[name] = self.node(dependency)
        node.inplace.extend(schemas.values())
        if needs or schemas:

            def check_dependencies(value: dict[str, Any], run: _Run) -> Any:
                for name, wanted in needs.items():
                    if name in value:
                        for each in wanted:
                            if each not in value:
                                return ((), partial(_say, "{} is a dependency of {}", each, name))
                for name, sub in schemas.items():
                    if name in value:
                        error = _judge(sub, value, run)
                        if error is not None:
                            return error
                return None

            self._add(node, (dict,), check_dependencies)

    def resolve_refs(self) -> None:
        while self.refs:
            node, ref = self.refs.pop()
            target = self._resolve(ref)
            compiled = self.node(target)
            compiled.shared = True
            node.ref.append(compiled)
            node.inplace.append(compiled)

    def _resolve(self, ref: str) -> Any:
        local = ref
        if self.root_id and ref.startswith(self.root_id):
            local = ref[len(self.root_id) :]
        if local in ("", "#"):
            return self.root
        if not local.startswith("#"):
            raise SchemaUnusable(f"the $ref {brief(ref)} is not local to the schema")
        fragment = unquote(local[1:])
        if not fragment.startswith("/"):
            if fragment in self.anchors:
                return self.anchors[fragment]
            raise SchemaUnusable(f"the $ref {brief(ref)} does not resolve")
        target = self.root
        for part in fragment[1:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise SchemaUnusable(f"the $ref {brief(ref)} does not resolve")
        return target

    def check_cycles(self) -> None:
        """A cycle of in-place applicators (``$ref``, ``allOf``...) would judge one value forever."""
        state = [0] * len(self.nodes)  # 0 unseen, 1 on the stack, 2 done
        for start in self.nodes:
            if state[start.index]:
                continue
            stack: list[tuple[_Node, int]] = [(start, 0)]
            state[start.index] = 1
            while stack:
                current, at = stack.pop()
                if at < len(current.inplace):
                    stack.append((current, at + 1))
                    following = current.inplace[at]
                    if state[following.index] == 1:
                        raise SchemaUnusable("a $ref cycle that does not descend into the arguments")
                    if state[following.index] == 0:
                        state[following.index] = 1
                        stack.append((following, 0))
                else:
                    state[current.index] = 2


def _equality_check(values: list[Any], *, one_of: bool) -> _Check:
    scalars = all(type(v) not in (list, dict) for v in values)
    keys = frozenset(_scalar_key(v) for v in values) if scalars else None
    if one_of:
        shown = brief(values)
        message = lambda value: f"{brief(value)} is not one of {shown}"  # noqa: E731
    else:
        shown = brief(values[0])
        message = lambda value: f"{shown} was expected"  # noqa: E731

    def check(value: Any, run: _Run) -> Any:
        if keys is not None:
            if type(value) in (list, dict) or _scalar_key(value) not in keys:
                return ((), lambda: message(value))
            return None
        wanted = run.consts.get(id(values))
        if wanted is None:
            wanted = run.consts[id(values)] = {run.canon(v) for v in values}
        return None if run.canon(value) in wanted else ((), lambda: message(value))

    return check


def _ref_check(target: list[_Node]) -> _Check:
    def check(value: Any, run: _Run) -> Any:
        return _judge(target[0], value, run)  # resolved once the whole document is compiled

    return check


def _length_check(limit: int, *, at_least: bool, says: str) -> _Check:
    def check(value: Any, run: _Run) -> Any:
        size = len(value)
        if size >= limit if at_least else size <= limit:
            return None
        return ((), lambda: f"{brief(value)} {says}")

    return check


def _pattern_check(program: Any, pattern: str) -> _Check:
    def check(value: str, run: _Run) -> Any:
        return (
            None
            if program.search(value) is not None
            else ((), lambda: f"{brief(value)} does not match {brief(pattern)}")
        )

    return check


def _unique(value: list[Any], run: _Run) -> Any:
    run.count(len(value))
    seen: set[Any] = set()
    canon = run.canon
    for item in value:
        key = canon(item)
        if key in seen:
            return ((), lambda: f"{brief(value)} has non-unique elements")
        seen.add(key)
    return None


def _multiple_of(divisor: int | float) -> _Check:
    def check(value: int | float, run: _Run) -> Any:
        if isinstance(divisor, float):
            try:
                quotient = value / divisor
                failed = int(quotient) != quotient
            except OverflowError:
                failed = (Fraction(value) / Fraction(divisor)).denominator != 1
        else:
            failed = bool(value % divisor)
        return ((), lambda: f"{brief(value)} is not a multiple of {divisor}") if failed else None

    return check


def _bound(keyword: str, limit: int | float, *, exclusive: bool) -> _Check:
    below = keyword == "minimum"
    if below:
        says = f"less than or equal to the minimum of {limit}" if exclusive else f"less than the minimum of {limit}"
    else:
        says = (
            f"greater than or equal to the maximum of {limit}" if exclusive else f"greater than the maximum of {limit}"
        )

    def check(value: int | float, run: _Run) -> Any:
        if below:
            failed = value <= limit if exclusive else value < limit
        else:
            failed = value >= limit if exclusive else value > limit
        return ((), lambda: f"{brief(value)} is {says}") if failed else None

    return check


def _combinator(keyword: str, branches: list[_Node]) -> _Check:
    if keyword == "allOf":

        def check_all(value: Any, run: _Run) -> Any:
            for branch in branches:
                error = _judge(branch, value, run)
                if error is not None:
                    return error
            return None

        return check_all
    if keyword == "anyOf":

        def check_any(value: Any, run: _Run) -> Any:
            errors = []
            for branch in branches:
                error = _judge(branch, value, run)
                if error is None:
                    return None
                errors.append(error)
            return _best(value, errors, "is not valid under any of the given schemas")

        return check_any

    def check_one(value: Any, run: _Run) -> Any:
        errors, valid = [], 0
        for branch in branches:
            error = _judge(branch, value, run)
            if error is None:
                valid += 1
            else:
                errors.append(error)
        if valid == 1:
            return None
        if valid > 1:
            return ((), lambda: f"{brief(value)} is valid under more than one of the given schemas")
        return _best(value, errors, "is not valid under any of the given schemas")

    return check_one


def _best(value: Any, errors: list[_Error], summary: str) -> _Error:
    """The error of the one branch that failed deeper than the others (the likeliest intent), else the summary."""
    deepest = max((len(e[0]) for e in errors), default=0)
    at_deepest = [e for e in errors if len(e[0]) == deepest]
    if deepest and len(at_deepest) == 1:
        return at_deepest[0]
    return ((), lambda: f"{brief(value)} {summary}")


# --- the compiled schema -------------------------------------------------------------------------------


class ArgumentsSchema:
    """A tool's inputSchema compiled once; ``check`` judges one set of arguments in linear time."""

    def __init__(
        self,
        root: _Node,
        draft: int,
        size: int,
        fast: Any = None,
        why_memo: str = "",
        numbers: bool = False,
        paths: int = 0,
    ) -> None:
        self._root = root
        self._fast = fast  # the jsonschema-rs validator, when it may judge this schema
        self._numbers = fast is not None and numbers  # its keywords compare numbers: look for inexact ones
        self.draft = draft
        self.size = size  # compiled schema nodes
        self.engine = FAST if fast is not None else MEMO
        self.why_memo = why_memo  # why the memo validator judges it ("" when jsonschema-rs does)
        self.paths = paths  # schema paths from the root: schema nodes that may judge one value

    def check(self, arguments: Any, *, max_nodes: int, max_items: int, max_steps: int) -> Verdict:
        """Valid (``error`` None), or the first error found; bounds and budget checked before and during.

        One pass of one engine: jsonschema-rs when the schema's work per value is bounded (it stops at
        the first error) and its paths times the values are at most ``FAST_WORK``, else the memo
        validator within ``max_steps``. Arguments jsonschema-rs cannot judge exactly (``_inexact``) or
        cannot take (it raises anything but a ValidationError) are judged by the memo validator.
        """
        too_large, inexact, values = _walk(arguments, max_nodes=max_nodes, max_items=max_items, numbers=self._numbers)
        if too_large is not None:
            return Verdict(too_large, 0, self.engine)
        if self._fast is not None and not inexact and self.paths * values <= FAST_WORK:
            try:
                self._fast.validate(arguments)
            except jsonschema_rs.ValidationError as exc:
                path = tuple(exc.instance_path)
                return Verdict(ArgumentError(path, _cut(exc.message), "invalid_arguments"), 0, FAST)
            except (ValueError, TypeError, OverflowError, RecursionError):
                pass
            else:
                return Verdict(None, 0, FAST)
        run = _Run(max_steps)
        try:
            error = _judge(self._root, arguments, run)
        except (_OverBudget, RecursionError):
            message = f"The arguments take more than {max_steps} steps to validate against the tool's inputSchema."
            return Verdict(ArgumentError((), message, "arguments_too_complex"), run.steps)
        if error is None:
            return Verdict(None, run.steps)
        return Verdict(ArgumentError(error[0], _text(error[1]), "invalid_arguments"), run.steps)


def _cut(message: str) -> str:
    """A jsonschema-rs message (which quotes the whole value) cut to a few brief reprs."""
    limit = 3 * BRIEF_LENGTH
    return message if len(message) <= limit else message[:limit] + "..."


def _why_slow(root: _Node) -> tuple[str, int]:
    """Why jsonschema-rs must not judge the schema of ``root`` ("" when it may): a cycle through
    ``$ref`` (a recursive schema), more than ``FAST_PATHS`` schema paths from the root (each value is
    judged by at most one schema node per path), or a node marked slow (``_Node.slow``); and the
    number of those paths (when it may)."""
    state: dict[int, int] = {root.index: 1}  # 1 on the stack, 2 done
    order: list[_Node] = []  # reverse topological order
    stack: list[tuple[_Node, int]] = [(root, 0)]
    while stack:
        current, at = stack.pop()
        edges = current.inplace + current.children
        if at < len(edges):
            stack.append((current, at + 1))
            following = edges[at]
            seen = state.get(following.index)
            if seen == 1:
                return "a recursive schema (a $ref cycle through the arguments)", 0
            if seen is None:
                state[following.index] = 1
                stack.append((following, 0))
        else:
            state[current.index] = 2
            order.append(current)
    paths = {root.index: 1}
    total = 0
    for node in reversed(order):
        if node.slow:
            return node.slow, 0
        count = paths.get(node.index, 0)
        total += count
        if total > FAST_PATHS:
            return f"more than {FAST_PATHS} schema paths can apply to one value", 0
        for following in node.inplace + node.children:
            paths[following.index] = paths.get(following.index, 0) + count
    return "", total


def _inexact(value: Any) -> bool:
    """A number past 2**53 in magnitude (or a NaN or infinity, which JSON has not): there jsonschema-rs's
    ``multipleOf`` and its equality (``enum``, ``const``) answer otherwise than exact arithmetic (its
    bounds compare exactly). A schema with those keywords sends such arguments to the memo validator."""
    t = type(value)
    if t is int or t is float:
        return not -_EXACT <= value <= _EXACT
    return False


def _holds_number(value: Any) -> bool:
    t = type(value)
    if t is int or t is float:
        return True
    if t is list:
        return any(_holds_number(v) for v in value)
    if t is dict:
        return any(_holds_number(v) for v in value.values())
    return False


_EXACT = 2**53


def _size_problem(value: Any, *, max_nodes: int, max_items: int) -> ArgumentError | None:
    """The first bound ``value`` passes, found by a walk that stops there (never reading further)."""
    return _walk(value, max_nodes=max_nodes, max_items=max_items, numbers=False)[0]


def _walk(value: Any, *, max_nodes: int, max_items: int, numbers: bool) -> tuple[ArgumentError | None, bool, int]:
    """The first bound ``value`` passes (a walk that stops there, never reading further); with
    ``numbers``, whether it holds a number jsonschema-rs cannot judge exactly (``_inexact``); the
    values in it (as far as the walk read)."""
    inexact = numbers and _inexact(value)
    if type(value) is not list and type(value) is not dict:
        return None, inexact, 1
    stack: list[Any] = [value]  # containers only: the path of one is found again for its error
    nodes = 1
    while stack:
        current = stack.pop()
        size = len(current)
        if size > max_items:
            what = "items" if type(current) is list else "properties"
            message = f"More than {max_items} {what}."
            return ArgumentError(_path_to(value, current), message, "arguments_too_large"), inexact, nodes
        nodes += size
        if nodes > max_nodes:
            message = f"The arguments hold more than {max_nodes} values."
            return ArgumentError((), message, "arguments_too_large"), inexact, nodes
        values = current if type(current) is list else current.values()
        if numbers and not inexact:
            inexact = any(map(_inexact, values))
        stack.extend([v for v in values if type(v) is list or type(v) is dict])
    return None, inexact, nodes


def _path_to(root: Any, target: Any) -> tuple[str | int, ...]:
    """The path from ``root`` to the container ``target`` (found by identity; linear, for an error only)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(root, ())]
    while stack:
        current, path = stack.pop()
        if current is target:
            return path
        pairs = enumerate(current) if type(current) is list else current.items()
        for key, item in pairs:
            if type(item) is list or type(item) is dict:
                stack.append((item, (*path, key)))
    return ()


def schema_compile(schema: Any, *, fast: bool = True) -> ArgumentsSchema:
    """The compiled validator of ``schema``; ``SchemaUnusable`` (with the reason) when it cannot be used.

    With ``fast`` (the default), jsonschema-rs judges it when its work per value is bounded
    (``_why_slow``); ``fast=False`` keeps it on the memo validator (tests, benchmarks).
    """
    if isinstance(schema, bool):
        draft = 2020
    elif not isinstance(schema, dict):
        raise SchemaUnusable("the schema is not an object")
    else:
        name = schema.get("$schema")
        if name is None:
            draft = 2020
        elif not isinstance(name, str) or name.removesuffix("#") not in DRAFTS:
            raise SchemaUnusable(f"the $schema {brief(name)} is not one the gateway knows")
        else:
            draft = DRAFTS[name.removesuffix("#")]
    try:
        _METASCHEMA_VALIDATORS[draft].check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise SchemaUnusable(f"the metaschema rejects it: {exc.message[:200]}") from exc
    except Exception as exc:  # the metaschema check itself failed on this document (a bad regex...)
        raise SchemaUnusable(f"the metaschema check failed: {str(exc)[:200]}") from exc
    compiler = _Compiler(schema, draft)
    root = compiler.node(schema)
    compiler.resolve_refs()
    compiler.check_cycles()
    why_memo, paths = _why_slow(root) if fast else ("the memo validator was asked for", 0)
    validator = None
    if not why_memo:
        try:
            validator = _FAST_VALIDATORS[draft](
                schema, validate_formats=False, pattern_options=jsonschema_rs.RegexOptions(), offline=True
            )
        except Exception as exc:  # a schema jsonschema-rs refuses stays on the memo validator
            why_memo = f"jsonschema-rs cannot compile it: {str(exc)[:200]}"
    return ArgumentsSchema(root, draft, len(compiler.nodes), validator, why_memo, compiler.numbers, paths)


@lru_cache(maxsize=256)
def _problem_of_text(text: str) -> str | None:
    try:
        schema_compile(json.loads(text))
    except SchemaUnusable as exc:
        return str(exc)
    return None


def input_schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot be a tool's inputSchema here (``SchemaUnusable``'s reason); None if it can.

    Cheap after the first time for a given schema (cached by its JSON text).
    """
    try:
        text = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return "the schema is not JSON"
    return _problem_of_text(text)
