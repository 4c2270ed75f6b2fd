"""The native library's folders depend downwards only, and one file reads the environment.

Layers, lowest first: core, kernels, cache, model, engine, api. A folder includes its own headers
and those of lower layers; an include of a higher layer is an error. core/options.cpp is the only
file under native/src that calls getenv (the options registry, core/options.h)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "native", "src")
LAYERS = ["core", "comm", "kernels", "cache", "model", "engine", "api"]  # comm: the TP communicators, on core alone
INCLUDE = re.compile(r'^\s*#\s*include\s+"(\w+)/', re.MULTILINE)


def sources():
    for folder, _, files in os.walk(SRC):
        for name in files:
            if name.endswith((".h", ".cuh", ".cpp", ".cu")):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, SRC), f.read()


def test_includes_point_down():
    upward = []
    for rel, text in sources():
        layer = LAYERS.index(rel.split(os.sep)[0])
        for target in INCLUDE.findall(text):
            if target in LAYERS and LAYERS.index(target) > layer:
                upward.append(f"{rel} includes {target}/")
    assert upward == []


def test_the_layer_check_sees_an_upward_include():
    text = '#include "core/error.h"\n  #include "engine/request.h"\n'
    assert INCLUDE.findall(text) == ["core", "engine"]


def test_only_the_options_registry_reads_the_environment():
    readers = sorted(rel for rel, text in sources() if re.search(r"\bgetenv\s*\(", text))
    assert readers == [os.path.join("core", "options.cpp")]
