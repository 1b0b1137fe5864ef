"""What a cluster worker needs to run ``warp etl`` tasks, checked on the worker before any task.

A worker started by hand (``dask worker`` on another machine) does not inherit the driver's
environment. docs/formats/receipts.md ("Clusters") states the split:

* **non-secret store settings travel with the tasks**: the driver's values of
  :data:`TRAVELLING` (endpoint, region, path style, anonymous reads) are set on
  every worker before its first task, so all of them address the store the driver
  planned against;
* **credentials never travel**: each worker takes them from its own environment,
  profile or instance role.

:func:`probe` runs once per worker (a Dask ``WorkerPlugin``, also on workers that
join later) and checks, cheaply, that the worker can reach every source and
output of the run: credentials resolve, one LIST of each store prefix answers, a
shared-filesystem path exists there. A failure is a
:class:`~warpdata.core.errors.ConfigError` (exit 78) naming the setting and the
worker: rerunning the same command cannot fix it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from warpdata.core import envvars
from warpdata.core.errors import AuthenticationError, ConfigError, StorePermissionError
from warpdata.storage.locations import StorageConfig, filesystem, parse_location

# store settings that say *where* the store is and *how* to address it; never secrets
TRAVELLING = ("WARP_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "WARP_S3_REGION", "AWS_REGION",
              "AWS_DEFAULT_REGION", "WARP_S3_PATH_STYLE", "WARP_S3_ANON")

CREDENTIALS_HINT = ("give every worker's environment AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE "
                    "with its ~/.aws files, or an instance role) before 'dask worker' starts: README, \"Clusters\"")


def travelling_settings() -> dict[str, str]:
    """The driver's non-secret store settings, to be set on every worker."""
    return {k: v for k in TRAVELLING if (v := envvars.get(k)) is not None}


def apply_settings(settings: Mapping[str, str]) -> None:
    """Set the driver's store settings on this worker (the driver's values win: one store)."""
    os.environ.update(settings)


def probe(paths: Sequence[tuple[str, str]], worker: str) -> None:
    """Check this process can reach every ``(role, url_or_path)`` of ``paths`` (role: ``source`` or
    ``output``); ConfigError naming the setting and ``worker`` when it cannot."""
    for role, target in paths:
        if "://" in target and not target.startswith("file://"):
            _probe_store(role, target, worker)
        else:
            _probe_path(role, target.removeprefix("file://"), worker)


def _probe_path(role: str, path: str, worker: str) -> None:
    if role == "source":
        if not os.path.exists(path):
            raise ConfigError(f"worker {worker} cannot see the source {path}",
                              hint="every worker must mount the source at the same path as the driver, "
                                   "or put it on object storage (s3://...)")
        return
    probe_dir = path
    while not os.path.exists(probe_dir) and os.path.dirname(probe_dir) != probe_dir:
        probe_dir = os.path.dirname(probe_dir)
    if not os.access(probe_dir, os.W_OK):
        raise ConfigError(f"worker {worker} cannot write the output {path} ({probe_dir} is not writable there)",
                          hint="every worker must mount the output at the same path as the driver, "
                               "or write it to object storage (s3://...)")


def _probe_store(role: str, url: str, worker: str) -> None:

    cfg = StorageConfig.from_env()
    if loc_protocol(url) == "s3" and not cfg.anon:
        missing = _missing_credentials(cfg.profile)
        if missing:
            raise AuthenticationError(f"worker {worker} has no S3 credentials for the {role} {url} ({missing})",
                                      hint=CREDENTIALS_HINT)
    loc = parse_location(url)
    quick = dataclasses.replace(cfg, retries=1, connect_timeout=5.0) if loc.protocol == "s3" else None
    fs = filesystem(loc, quick)
    target = loc.path if role == "source" else loc.path.split("/", 1)[0]
    try:
        fs.ls(target, refresh=True)
    except FileNotFoundError:
        return  # a missing source or prefix is the driver's to report, with its own words
    except Exception as e:
        raise _access_error(e, role, url, worker, cfg.endpoint_url) from None


def loc_protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def _missing_credentials(profile: str | None) -> str | None:
    """None when botocore's chain finds credentials here; else which settings it looked for."""
    try:
        import botocore.session
        from botocore.exceptions import BotoCoreError
    except ImportError:
        return None
    try:
        creds = botocore.session.Session(profile=profile).get_credentials()
    except BotoCoreError as e:  # e.g. a profile this machine does not have
        return f"{type(e).__name__}: {e}"
    if creds is None:
        return ("AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are not set, no AWS_PROFILE, no instance role"
                if profile is None else f"profile {profile!r} has none")
    return None


def _access_error(e: BaseException, role: str, url: str, worker: str, endpoint: str | None) -> ConfigError:
    code = ""
    with_response = getattr(e, "response", None)
    if isinstance(with_response, dict):
        code = str(with_response.get("Error", {}).get("Code", ""))
    text = f"{type(e).__name__}: {e}"
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch") or "InvalidAccessKeyId" in text \
            or "SignatureDoesNotMatch" in text or "NoCredentials" in text:
        return AuthenticationError(f"worker {worker}: the store refused its S3 credentials for the {role} {url} "
                                   f"({text})", hint=CREDENTIALS_HINT)
    if code == "AccessDenied" or isinstance(e, PermissionError) or "AccessDenied" in text:
        return StorePermissionError(f"worker {worker} may not {'read' if role == 'source' else 'write'} "
                                    f"the {role} {url} ({text})",
                                    hint="grant the worker's credentials access to the bucket (README, \"Clusters\")")
    return ConfigError(f"worker {worker} cannot reach the store of the {role} {url} at "
                       f"{endpoint or 'the AWS endpoint'} ({text})",
                       hint="WARP_S3_ENDPOINT (sent to every worker) must be reachable from the workers' "
                            "machines: use an address they can resolve, not 127.0.0.1 of the driver's",
                       key="WARP_S3_ENDPOINT")
