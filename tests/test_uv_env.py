"""scripts/uv_env.py: uv gets the package sources pip is configured with (the Makefile's bootstrap)."""
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("uv_env", Path(__file__).parents[1] / "scripts" / "uv_env.py")
uv_env = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uv_env)

LISTING = """\
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/srv/old-wheels'
user.index-url='https://mirror.example/simple'
"""


def test_pip_settings_take_the_highest_scope_and_skip_other_keys():
    settings = uv_env.pip_settings(LISTING)
    assert settings == {"find-links": "/opt/wheels",  # PIP_FIND_LINKS beats pip.conf's global value
                        "constraint": "/etc/xdg/pip/constraints.txt",
                        "extra-index-url": "file:///opt/pypi/simple file:///opt/pypi-more/simple",
                        "index-url": "https://mirror.example/simple"}


def test_uv_exports_use_uv_separators_and_leave_set_variables_alone():
    exports = uv_env.uv_exports(uv_env.pip_settings(LISTING + "global.find-links='/a /b'\n"),
                                {"UV_INDEX_URL": "https://mine/simple"})
    assert "export UV_FIND_LINKS=/opt/wheels" in exports
    assert "export UV_EXTRA_INDEX_URL='file:///opt/pypi/simple file:///opt/pypi-more/simple'" in exports
    assert "export UV_CONSTRAINT=/etc/xdg/pip/constraints.txt" in exports
    assert "export UV_INDEX_STRATEGY=unsafe-best-match" in exports  # pip's best-version-across-indexes
    assert not any(line.startswith("export UV_INDEX_URL") for line in exports)
    several = uv_env.uv_exports({"find-links": "/a  /b"}, {})
    assert several[0] == "export UV_FIND_LINKS=/a,/b"  # uv splits find-links on commas


def test_no_pip_configuration_exports_only_the_strategy():
    assert uv_env.uv_exports(uv_env.pip_settings(""), {}) == ["export UV_INDEX_STRATEGY=unsafe-best-match"]
