"""Drives keypool over TLS with the official Anthropic Python SDK (run by
tests/tests/listeners.rs): keypool's certificate is signed by a test CA made by the test.

Environment: KEYPOOL_BASE_URL (https://localhost:PORT/acme/team), KEYPOOL_KEY,
KEYPOOL_CA_FILE (the test CA, PEM), KEYPOOL_MODEL. Prints one JSON object. Retries are
off (max_retries=0) so that a retry can never hide a failure.
"""

import json
import os

import ssl

import anthropic


def main() -> None:
    base_url = os.environ["KEYPOOL_BASE_URL"]
    key = os.environ["KEYPOOL_KEY"]
    model = os.environ["KEYPOOL_MODEL"]
    messages = [{"role": "user", "content": "Hello"}]
    trusted = anthropic.Anthropic(
        base_url=base_url,
        api_key=key,
        max_retries=0,
        timeout=30.0,
        # the SDK's own httpx client class, trusting only the test CA
        http_client=anthropic.DefaultHttpxClient(
            verify=ssl.create_default_context(cafile=os.environ["KEYPOOL_CA_FILE"])
        ),
    )
    out = {"sdk_version": anthropic.__version__, "base_url": base_url}
    raw = trusted.messages.with_raw_response.create(
        model=model, max_tokens=64, messages=messages
    )
    message = raw.parse()
    out["create"] = {"status": raw.status_code, "type": message.type}
    events = []
    with trusted.messages.stream(model=model, max_tokens=64, messages=messages) as stream:
        for event in stream:
            events.append(event.type)
    out["stream"] = {"events": events}
    # the SDK's own trust store does not know the test CA
    untrusted = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=10.0)
    try:
        untrusted.messages.create(model=model, max_tokens=8, messages=messages)
        out["untrusted"] = "accepted"
    except anthropic.APIConnectionError as e:
        out["untrusted"] = type(e).__name__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
