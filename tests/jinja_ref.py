#!/usr/bin/python3
"""The reference renderer of tests/test_jinja.c: Python's jinja2 (Debian's
python3-jinja2) in the environment transformers renders chat templates in
(transformers/utils/chat_template_utils.py): ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception,
strftime_now, and {% generation %} rendered as its body.

stdin: a JSON list of cases {"template", "data", "trusted", "now"}; "data" and
"trusted" are objects of variables (data's names win), "now" the clock of
strftime_now in seconds since the epoch. stdout: a JSON list of
{"ok": true, "text": ...} or {"ok": false, "error": ...}, one per case."""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


_compiled = {}


def render(case, now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(now).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    variables = dict(case.get("data") or {})
    variables.update(case.get("trusted") or {})   # as jinja_render: trusted wins
    key = (case["template"], now)
    if key not in _compiled:   # one compile per template: the corpus renders each many times
        _compiled[key] = env.from_string(case["template"])
    return _compiled[key].render(**variables)


def main():
    cases = json.load(sys.stdin)
    out = []
    for case in cases:
        try:
            out.append({"ok": True, "text": render(case, case.get("now", 0))})
        except Exception as e:  # every failure is an answer: the engine must fail too
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout)


main()
