"""The host package without corehandler-fleet, as this process can make it: the fleet's modules made
unimportable (None in sys.modules, as for a module that is not installed). Everything else still imports; a
fleet verb stops with one line naming the package (exit 5); an [upload] section still loads; the uploader
keeps uploads off without dropping the queue and says why; `status` says it too. A reload after the package
came turns uploads on. (tests/system/test_deb_suites.py: the real packages in Debian roots.)"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import corehandler
from corehandler.cli import main
from corehandler.config import UploadConfig
from corehandler.errors import EXIT_CONFLICT
from corehandler.fleet import available, upload
from corehandler.store import upload_queue
from corehandler.store.index import Store
from support.lockfile import canonical

ROOT = Path(__file__).resolve().parents[2]
# A valid age X25519 public key (age-keygen's format).
RECIPIENT = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"


@pytest.fixture
def no_fleet(monkeypatch):
    """This interpreter as the host package alone has it."""
    for name in available.MODULES:
        monkeypatch.setitem(sys.modules, name, None)


def test_the_modules_checked_are_the_extras():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["fleet"]
    names = {canonical(re.match(r"[A-Za-z0-9._-]+", spec).group(0)) for spec in extra}
    assert names == {canonical(m) for m in available.MODULES}


def test_with_the_fleet_installed_nothing_is_missing():
    assert available.missing() == [] and available.why_off() is None
    available.require("fleet list")  # no error


def test_without_the_fleet_every_module_of_ours_still_imports():
    """Run in a fresh interpreter, so that nothing imported by an earlier test hides an import at start."""
    script = ("import sys, importlib, pkgutil, corehandler\n"
              f"for m in {available.MODULES!r}: sys.modules[m] = None\n"
              "for mi in pkgutil.walk_packages(corehandler.__path__, 'corehandler.'):\n"
              "    if not mi.name.endswith('__main__'): importlib.import_module(mi.name)\n"
              "import corehandler.cli; corehandler.cli.build_parser()\n")
    result = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(list(pkgutil.walk_packages(corehandler.__path__, "corehandler."))) > 50


def test_a_fleet_verb_names_the_package_in_one_line(no_fleet, tmp_path, capsys):
    code = main(["--config-dir", str(tmp_path), "--state-dir", str(tmp_path / "state"), "fleet", "list"])
    err = capsys.readouterr().err
    assert code == EXIT_CONFLICT and err.count("\n") == 1, err
    assert err.startswith("corehandler: fleet list needs the fleet's libraries") and "install corehandler-fleet" in err
    assert "pyarrow" in err and "corehandler[fleet]" in err


def test_an_upload_section_with_recipients_loads_without_pyrage(no_fleet):
    section = UploadConfig.model_validate({"url": "s3://fleet-bucket/p", "recipients": [RECIPIENT]})
    assert section.recipients == [RECIPIENT]
    for bad in ("age1NOT A KEY", "AGE-SECRET-KEY-1QQQQ"):
        with pytest.raises(ValueError) as e:
            UploadConfig.model_validate({"url": "s3://fleet-bucket/p", "recipients": [bad]})
        assert "SECRET" not in str(e.value).split("input_value")[0]


def test_the_uploader_keeps_uploads_off_and_the_queue_and_says_why(no_fleet, tmp_path, caplog):
    caplog.set_level(logging.WARNING, "corehandler.fleet.upload")
    section = UploadConfig.model_validate({"url": "s3://fleet-bucket/p", "host": "h1", "recipients": [RECIPIENT]})
    uploader = upload.Uploader(section, tmp_path)
    assert uploader.target is None and "install corehandler-fleet" in uploader.unavailable
    assert "Uploads are off although [upload] url is set: corehandler-fleet is not installed" in caplog.text
    with Store(tmp_path) as store:
        upload_queue.ensure_schema(store.db)
        upload_queue.enqueue(store.db, "1-0123456789abcdef-1")
        uploader._recover(store)
        uploader.on_ingested({}, {"id": "1-0123456789abcdef-2"})
        # Kept for when the package comes: nothing waiting is dropped, new dumps still queue.
        assert upload_queue.waiting_ids(store.db) == {"1-0123456789abcdef-1", "1-0123456789abcdef-2"}
    uploader.close()


def test_a_reload_after_the_package_came_turns_uploads_on(monkeypatch, tmp_path):
    present = {name: sys.modules.get(name) for name in available.MODULES}
    for name in available.MODULES:
        monkeypatch.setitem(sys.modules, name, None)
    section = UploadConfig.model_validate({"url": "s3://fleet-bucket/p", "host": "h1"})
    uploader = upload.Uploader(section, tmp_path)
    assert uploader.target is None
    for name, module in present.items():  # the package installed: its modules importable again
        if module is None:
            monkeypatch.delitem(sys.modules, name)
        else:
            monkeypatch.setitem(sys.modules, name, module)
    uploader.reconfigure(section)
    assert uploader._take_reconfigured()
    assert uploader.unavailable is None and uploader.target is not None and uploader.target.bucket == "fleet-bucket"
    uploader.close()


def test_status_says_uploads_are_off_and_why(no_fleet, tmp_path, capsys):
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "corehandler.toml").write_text('[upload]\nurl = "s3://fleet-bucket/p"\n')
    main(["--config-dir", str(etc), "--state-dir", str(tmp_path / "state"), "status"])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("upload:"))
    assert "s3://fleet-bucket/p OFF: corehandler-fleet is not installed" in line and "install corehandler-fleet" in line


def test_the_modules_come_back_after_the_fixture():
    """The fixture leaves no None behind: the rest of the suite imports the fleet as before."""
    assert importlib.import_module("pyarrow") is not None and available.missing() == []
