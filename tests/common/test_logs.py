"""Structured logs: JSON lines with fields; secrets never reach a log line."""

from __future__ import annotations

import io
import json
import logging

from epu.common.broker import Broker
from epu.common.logs import setup_logging


def test_json_logs_carry_fields_and_redact_secrets() -> None:
    stream = io.StringIO()
    setup_logging("info", json_format=True, stream=stream)
    logging.getLogger("epu.test").info("context created", extra={"context_id": "c1", "secret": "s3cr3t",
                                                                  "auth": {"api_token": "t0k"}})
    doc = json.loads(stream.getvalue().splitlines()[-1])
    assert doc["event"] == "context created" and doc["context_id"] == "c1" and doc["level"] == "info"
    assert doc["secret"] == "***" and doc["auth"]["api_token"] == "***"
    assert "s3cr3t" not in stream.getvalue() and "t0k" not in stream.getvalue()


def test_text_logs_are_key_value() -> None:
    stream = io.StringIO()
    setup_logging("debug", json_format=False, stream=stream)
    logging.getLogger("epu.test").warning("broker connection lost", extra={"retry_in": 0.5})
    assert "WARNING" in stream.getvalue() and "retry_in=0.5" in stream.getvalue()


def test_broker_urls_are_logged_without_password() -> None:
    assert Broker("amqp://epu-decision:hunter2@rabbit:5672/epu").redacted_url() == "amqp://epu-decision:***@rabbit:5672/epu"
    assert Broker("memory://").redacted_url() == "memory://"
