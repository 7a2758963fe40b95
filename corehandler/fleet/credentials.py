"""[upload]'s credentials, found the way the AWS tools find them: botocore's own credential chain, which
refreshes temporary credentials before they expire. In botocore's order: the environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), a profile's role_arn (with source_profile or credential_source, via
STS), web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, as on EKS, or web_identity_token_file in a
profile), SSO (sso_session ...), the shared credentials file, credential_process, the config file, the ECS
container endpoint, and EC2 instance metadata.

upload.credentials_file and upload.config_file name the shared files (AWS_SHARED_CREDENTIALS_FILE and
AWS_CONFIG_FILE otherwise, else ~/.aws/, which corehandler.service's ProtectHome= hides); upload.profile picks a
profile in them (AWS_PROFILE otherwise, else "default"). Either file is refused unless only root (or the user
running us) can read and write it: the keys open every host's dumps, and a config file's credential_process is
a command the daemon runs as root.
"""

from __future__ import annotations

import configparser
import os
import stat
from pathlib import Path

from corehandler.errors import EXIT_PERMISSION, CorehandlerError


class CredentialsFileError(CorehandlerError):
    exit_code = EXIT_PERMISSION


def check_private(path: Path, what: str) -> None:
    """Raises CredentialsFileError unless path is a file only root (or our own user) can read or change."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise CredentialsFileError(f"{what} {path}: {e.strerror}") from None
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialsFileError(f"{what} {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}, "
                                   f"owner uid {st.st_uid}); chown root and chmod 0600 it")


def _parse_problem(e: Exception) -> str:
    """What is wrong with a credentials or config file, by line number only: configparser's own message quotes
    the offending line, which may be the secret itself, and this message goes to the log and to `status`."""
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 (byte {e.start})"
    lines = [n for n, _ in getattr(e, "errors", [])] or [getattr(e, "lineno", None)]
    where = ", ".join(str(n) for n in lines if n is not None)
    kind = {"MissingSectionHeaderError": "a line before any [profile]", "ParsingError": "a line that is not "
            "key = value", "DuplicateSectionError": "a duplicate [profile]", "DuplicateOptionError": "a duplicate "
            "key"}.get(type(e).__name__, "malformed")
    return f"{kind}" + (f" (line {where})" if where else "")


def check_parses(path: Path, what: str) -> None:
    """Raises CredentialsFileError naming the line botocore's parser would refuse (botocore's own error names
    the file only), never quoting it."""
    parser = configparser.RawConfigParser()  # what botocore.configloader reads them with
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except OSError as e:
        raise CredentialsFileError(f"{what} {path}: cannot read: {e.strerror}") from None
    except (UnicodeDecodeError, configparser.Error) as e:
        raise CredentialsFileError(f"{what} {path}: cannot read: {_parse_problem(e)}") from None


def botocore_session(config):
    """A botocore session whose credential chain reads [upload]'s files and profile."""
    import botocore.session
    from botocore.exceptions import BotoCoreError

    session = botocore.session.Session()
    for key in ("credentials_file", "config_file"):
        path = getattr(config, key)
        if path:
            check_private(Path(path), f"upload.{key}")
            check_parses(Path(path), f"upload.{key}")
            session.set_config_variable(key, path)
    if config.profile:
        session.set_config_variable("profile", config.profile)
    try:
        session.get_scoped_config()  # an unknown profile or a file that does not parse: now, not at the upload
    except BotoCoreError as e:
        raise CredentialsFileError(f"upload: {e}") from None
    return session
