"""Configuration: defaults, valid files, errors naming file/key/value, drop-in precedence, csplice.conf."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from corehandler import config as config_mod
from corehandler.config import (
    Config,
    config_files,
    load_config,
)
from corehandler.configtext import config_json, render_toml
from corehandler.errors import EXIT_CONFIG, ConfigError
from corehandler.paths import Paths
from corehandler.units import SizeOrPercent

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "corehandler.toml"


@pytest.fixture
def paths(tmp_path) -> Paths:
    (tmp_path / "etc").mkdir()
    return Paths(state_dir=tmp_path / "state", config_dir=tmp_path / "etc", run_dir=tmp_path / "run")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_missing_main_file_means_defaults(paths):
    assert load_config(paths) == Config()
    assert config_files(paths) == []


def test_defaults_match_design():
    c = Config()
    assert c.state_dir == Path("/var/lib/corehandler")
    assert c.capture.strategy == "auto"
    assert c.capture.chunk_size == 256 << 10
    assert c.capture.pipe_size == 1 << 20
    assert c.capture.max_dump_size == 32 << 30
    assert c.capture.min_free == SizeOrPercent(percent=15.0)
    assert c.capture.timeout == 3600.0
    assert c.retention.max_use.resolve(1000) == 100
    assert c.retention.max_age == 0.0
    assert c.metrics.port == 9577
    assert c.journal.enabled is True


def test_valid_file_values_come_out_parsed(paths):
    write(paths.config_file, """
state_dir = "/srv/cores/"
[capture]
strategy = "splice2"
chunk_size = "1M"
pipe_size = 1048576
max_dump_size = "1.5GiB"
min_free = "2G"
timeout = "1h30m"
fsync = true
[retention]
max_use = "20%"
max_age = "2w"
max_per_exe = 3
[metrics]
listen = "::1"
textfile = "/var/lib/node_exporter/corehandler.prom"
exe_label_allowlist = ["/usr/bin/python3"]
[analysis]
resymbolise_after = ["30m", "1h30m", "2d"]
""")
    c = load_config(paths)
    assert c.analysis.resymbolise_after == [1800.0, 5400.0, 172800.0]
    assert c.state_dir == Path("/srv/cores")
    assert c.capture.strategy == "splice2"
    assert c.capture.chunk_size == 1 << 20
    assert c.capture.pipe_size == 1 << 20
    assert c.capture.max_dump_size == 3 << 29
    assert c.capture.min_free == SizeOrPercent(bytes=2 << 30)
    assert c.capture.timeout == 5400.0
    assert c.capture.fsync is True
    assert c.retention.max_use.resolve(1000) == 200
    assert c.retention.max_age == 14 * 86400.0
    assert c.metrics.listen == "::1"
    assert c.paths(paths).state_dir == Path("/srv/cores")
    assert c.paths(paths).config_dir == paths.config_dir


@pytest.mark.parametrize("body, key, value, message", [
    ('[capture]\nmax_dump_size = "4KB"\n', "capture.max_dump_size", '"4KB"', "use K or KiB"),
    ('[capture]\nchunk_size = "1K"\n', "capture.chunk_size", '"1K"', "between 4K and 64M"),
    ('[capture]\npipe_size = "2G"\n', "capture.pipe_size", '"2G"', "between 0 and 1G"),
    ('[capture]\nmax_pending = "64"\n', "capture.max_pending", '"64"', "valid integer"),
    ('[capture]\nmax_pending = -1\n', "capture.max_pending", "-1", "greater than or equal to 0"),
    ('[capture]\nfsync = "yes"\n', "capture.fsync", '"yes"', "valid boolean"),
    ('[capture]\nstrategy = "fast"\n', "capture.strategy", '"fast"', "'auto', 'rw'"),
    ('[capture]\ntimeout = "1aeon"\n', "capture.timeout", '"1aeon"', "unknown duration unit"),
    ('[capture]\nmin_free = "150%"\n', "capture.min_free", '"150%"', "more than 100%"),
    ('[capture]\nmax_dump = "1G"\n', "capture.max_dump", '"1G"', "unknown option"),
    ('[captures]\nmax_pending = 1\n', "captures", None, "unknown option"),
    ('capture = 5\n', "capture", "5", "must be a table"),
    ('state_dir = "var/lib"\n', "state_dir", '"var/lib"', "absolute path"),
    ('state_dir = "/var/lib/x\\ny"\n', "state_dir", None, "control characters"),
    ('[compression]\nlevel = 30\n', "compression.level", "30", "less than or equal to 22"),
    ('[retention]\ninterval = "0"\n', "retention.interval", '"0"', "between 1s and"),
    ('[retention]\nkeep_free = "lots"\n', "retention.keep_free", '"lots"', "or a percentage"),
    ('[metrics]\nlisten = "localhost"\n', "metrics.listen", '"localhost"', "IP address"),
    ('[metrics]\nport = 70000\n', "metrics.port", "70000", "less than or equal to 65535"),
    ('[metrics]\ntextfile = "metrics.prom"\n', "metrics.textfile", '"metrics.prom"', "absolute path"),
    ('[journal]\nenabled = 1\n', "journal.enabled", "1", "valid boolean"),
    ('[analysis]\nresymbolise_after = ["0s"]\n', "analysis.resymbolise_after", None, "between 1s and"),
    ('[analysis]\nresymbolise_after = "1h"\n', "analysis.resymbolise_after", None, "list of at most 16"),
    ('[analysis]\nresymbolise_after = ["1h"' + ', "1h"' * 16 + ']\n', "analysis.resymbolise_after", None,
     "list of at most 16"),
])
def test_invalid_value_names_file_key_and_value(paths, body, key, value, message):
    write(paths.config_file, body)
    with pytest.raises(ConfigError) as err:
        load_config(paths)
    e = err.value
    assert e.exit_code == EXIT_CONFIG
    assert e.file == str(paths.config_file)
    assert e.key == key
    assert e.message.startswith(f"{paths.config_file}: {key}")
    if value is not None:
        assert f"{key} = {value}:" in e.message
    assert message in e.message


def test_every_error_is_reported_on_one_line(paths):
    write(paths.config_file, '[capture]\nmax_pending = -1\nfsync = "no"\n')
    with pytest.raises(ConfigError) as err:
        load_config(paths)
    assert "\n" not in err.value.message
    assert "capture.max_pending" in err.value.message and "capture.fsync" in err.value.message


def test_toml_syntax_error_names_file_and_line(paths):
    write(paths.config_file, '[capture]\nmax_pending = \n')
    with pytest.raises(ConfigError, match=re.escape(str(paths.config_file)) + r": not valid TOML: .*line 2"):
        load_config(paths)


def test_unreadable_file_and_bad_utf8(paths):
    write(paths.config_file, "")
    paths.config_file.write_bytes(b'state_dir = "/\xff"\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(paths)
    paths.config_file.unlink()
    paths.config_file.mkdir()
    with pytest.raises(ConfigError, match=re.escape(str(paths.config_file)) + ": cannot read"):
        load_config(paths)


def test_dropins_later_wins_key_by_key(paths):
    write(paths.config_file, '[capture]\nmax_pending = 10\nfsync = true\n[retention]\nmax_count = 5\n')
    write(paths.dropin_dir / "20-b.toml", '[capture]\nmax_pending = 30\n')
    write(paths.dropin_dir / "10-a.toml", '[capture]\nmax_pending = 20\nsparse = false\n[metrics]\nport = 1234\n')
    write(paths.dropin_dir / "99-ignored.conf", '[capture]\nmax_pending = 99\n')
    c = load_config(paths)
    assert c.capture.max_pending == 30  # 20-b.toml is read last
    assert c.capture.fsync is True  # from the main file, untouched by drop-ins
    assert c.capture.sparse is False  # from 10-a.toml
    assert c.retention.max_count == 5
    assert c.metrics.port == 1234
    assert config_files(paths) == [paths.config_file, paths.dropin_dir / "10-a.toml", paths.dropin_dir / "20-b.toml"]


def test_dropins_without_main_file(paths):
    write(paths.dropin_dir / "x.toml", 'state_dir = "/srv/x"\n')
    assert load_config(paths).state_dir == Path("/srv/x")


def test_error_names_the_dropin_that_set_the_value(paths):
    write(paths.config_file, '[capture]\nmax_pending = 10\n')
    bad = write(paths.dropin_dir / "50-bad.toml", '[capture]\nmax_pending = "many"\n')
    write(paths.dropin_dir / "60-other.toml", '[capture]\nfsync = true\n')
    with pytest.raises(ConfigError) as err:
        load_config(paths)
    assert err.value.file == str(bad)
    assert err.value.message.startswith(f"{bad}: capture.max_pending = \"many\"")


def test_dropin_overriding_a_bad_main_value_fixes_it(paths):
    write(paths.config_file, '[capture]\nmax_pending = "many"\n')
    write(paths.dropin_dir / "fix.toml", '[capture]\nmax_pending = 3\n')
    assert load_config(paths).capture.max_pending == 3


def test_shipped_file_lists_every_option_and_parses_to_defaults():
    text = SHIPPED.read_text()
    assert tomllib.loads(text) == {name: {} for name, f in Config.model_fields.items()
                                   if isinstance(f.default, config_mod.BaseModel)}
    settings = {}
    section = None
    for line in text.splitlines():
        if m := re.fullmatch(r"\[(\w+)\]", line):
            section = m.group(1)
        elif m := re.fullmatch(r"#(\w+) = .*", line):
            settings.setdefault(section, []).append(m.group(1))
    for name, field in Config.model_fields.items():
        sub = field.default
        if isinstance(sub, config_mod.BaseModel):
            assert settings[name] == list(type(sub).model_fields), f"[{name}] in {SHIPPED}"
        else:
            assert name in settings[None]
    uncommented = re.sub(r"(?m)^#(\w+ = )", r"\1", text)
    assert Config.model_validate(tomllib.loads(uncommented)) == Config()


def test_shipped_file_is_the_rendered_defaults():
    assert SHIPPED.read_text() == render_toml(Config(), commented_defaults=True), \
        "regenerate config/corehandler.toml from render_toml(Config(), commented_defaults=True)"


def test_show_output_round_trips(paths):
    write(paths.config_file, '[capture]\nmin_free = "2G"\ntimeout = "90s"\n[metrics]\nexe_label_allowlist = '
                             '["a\\"b", "\\u00e9\\u007f"]\n[retention]\nmax_use = "12.5%"\n')
    c = load_config(paths)
    shown = render_toml(c)
    assert 'min_free = "2G"' in shown and 'timeout = "1m30s"' in shown
    assert Config.model_validate(tomllib.loads(shown)) == c


def test_config_json_has_parsed_values():
    data = config_json(Config())
    assert data["capture"]["max_dump_size"] == 32 << 30
    assert data["capture"]["min_free"] == "15%"
    assert data["capture"]["timeout"] == 3600.0
    assert data["state_dir"] == "/var/lib/corehandler"


def test_config_errors_never_echo_a_secret(paths):
    """A private key in recipients, an S3 secret as an unknown option, a URL with a password: each is refused
    by a message that names the key and never prints the secret (the message goes to logs)."""
    from pyrage import x25519

    private = str(x25519.Identity.generate())
    write(paths.config_file, f'[upload]\nrecipients = ["{private}"]\n'
                             f'aws_secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"\n'
                             f'endpoint = "https://AKIDEXAMPLE:hunter2@s3.example.com/ bad"\n'
                             f'[capture]\nmax_pending = "{private}"\n')
    with pytest.raises(ConfigError) as err:
        load_config(paths)
    text = err.value.message + repr(err.value.value)
    assert "upload.recipients: an age private key (AGE-SECRET-KEY-1…) is not a recipient" in text
    for secret in (private[15:], "wJalrXUtnFEMI", "hunter2"):
        assert secret not in text
    assert "upload.aws_secret_access_key: unknown option" in text and "upload.endpoint" in text
    assert "capture.max_pending" in text


def test_the_shipped_file_sends_edits_to_a_drop_in(paths):
    """The shipped file is a conffile that changes with most releases: an admin who edits it in place gets dpkg's
    prompt on every upgrade (and a non-interactive upgrade fails). Its header says where edits go instead, and
    the drop-in it shows works over the shipped file."""
    header = [line for line in SHIPPED.read_text().splitlines() if line.startswith("#")][:5]
    text = " ".join(line.lstrip("# ") for line in header)
    assert "uncomment" not in text and "Do not edit this file" in text
    assert "/etc/corehandler/corehandler.d/NAME.toml" in text
    example = re.search(r'"(\[\w+\])" then "(\w+ = \w+)"', text)
    assert example, text
    write(paths.config_file, SHIPPED.read_text())
    write(paths.dropin_dir / "local.toml", f"{example.group(1)}\n{example.group(2)}\n")
    assert load_config(paths).capture.max_pending == 8 != Config().capture.max_pending
