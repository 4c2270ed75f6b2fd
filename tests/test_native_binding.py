"""The cffi binding: the header parses, the API version is checked, errors carry messages."""

import os
import re

import cffi
import pytest

from pyengine import _native


def test_cffi_parses_the_public_header():
    with open(_native.header_path()) as f:
        src = _native.cdef_source(f.read())
    ffi = cffi.FFI()
    ffi.cdef(src)  # raises on anything cffi cannot parse
    assert ffi.sizeof("pe_event") > 0
    assert ffi.typeof("pe_engine_params").kind == "struct"


def test_library_reports_the_header_version():
    n = _native.native()
    assert n.lib.pe_api_version() == n.lib.PE_API_VERSION
    assert n.build_info.startswith("cpu")


def test_a_library_of_another_version_is_refused(monkeypatch, tmp_path):
    with open(_native.header_path()) as f:
        header = f.read()
    bumped = re.sub(r"#define PE_API_VERSION \d+", "#define PE_API_VERSION 999", header)
    assert bumped != header
    fake = tmp_path / "pyengine.h"
    fake.write_text(bumped)
    monkeypatch.setattr(_native, "header_path", lambda: str(fake))
    with pytest.raises(Exception, match="API version"):
        _native.Native()


def test_errors_carry_the_native_message():
    n = _native.native()
    c = n.ffi.new("pe_model_config*")
    out = n.ffi.new("pe_model**")
    status = n.lib.pe_model_create(c, b"cpu", out)
    assert status == n.lib.PE_ERR_INVALID_ARGUMENT
    assert "vocab_size" in n.last_error()
    status = n.lib.pe_model_create(c, b"tpu", out)
    assert status != 0
