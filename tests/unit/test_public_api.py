from __future__ import annotations

import synnefo_ganeti
import synnefo_ganeti.rapi


def test_top_level_exports_are_pinned() -> None:
    assert sorted(synnefo_ganeti.__all__) == sorted(
        [
            "FINAL_STATUSES", "AuthenticationError", "BadRequestError", "CancelResult", "ClusterInfo",
            "ConfigError", "ControlPlane", "CreateOutcomeUnknownError", "CreateProgress", "GanetiError", "Instance",
            "InstanceSpec", "Job", "JobFailedError", "JobFailure", "JobNotFoundError", "JobStatus", "LogEntry",
            "Node", "NotFoundError", "RapiClient", "RapiConnectionError", "RapiError", "RapiTimeoutError",
            "RetryPolicy", "StoreError", "TLSError", "Timestamp", "TransportError", "UnavailableError", "__version__",
            "calc_job_status",
        ]
    )  # fmt: skip
    for name in synnefo_ganeti.__all__:
        assert getattr(synnefo_ganeti, name) is not None, name


def test_rapi_names_are_reexported_from_the_package() -> None:
    for name in ("RapiClient", "InstanceSpec", "Instance", "Node", "Job", "JobStatus"):
        assert getattr(synnefo_ganeti, name) is getattr(synnefo_ganeti.rapi, name)


def test_every_error_derives_from_ganeti_error() -> None:
    errors = [getattr(synnefo_ganeti, n) for n in synnefo_ganeti.__all__ if n.endswith("Error")]
    assert len(errors) == 15
    for cls in errors:
        assert issubclass(cls, synnefo_ganeti.GanetiError), cls
    assert issubclass(synnefo_ganeti.RapiTimeoutError, TimeoutError)
    assert issubclass(synnefo_ganeti.ConfigError, ValueError)
