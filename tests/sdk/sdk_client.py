"""Drives keypool with the official Anthropic Python SDK (run by tests/tests/sdk.rs).

Environment: KEYPOOL_BASE_URL (the org-scoped pool URL, e.g. http://127.0.0.1:PORT/acme/team),
KEYPOOL_KEY (a valid sk-lb- key), KEYPOOL_BAD_KEY (an unknown one), KEYPOOL_MODEL.
Prints one JSON object with what the SDK got back; the Rust side asserts on it.
SDK retries are off (max_retries=0) so that a retry can never hide a failure.
"""

import json
import os
import sys

import anthropic


def main() -> None:
    base_url = os.environ["KEYPOOL_BASE_URL"]
    model = os.environ["KEYPOOL_MODEL"]
    messages = [{"role": "user", "content": "Hello"}]
    client = anthropic.Anthropic(
        base_url=base_url, api_key=os.environ["KEYPOOL_KEY"], max_retries=0, timeout=30.0
    )
    out = {"sdk_version": anthropic.__version__}

    raw = client.messages.with_raw_response.create(
        model=model, max_tokens=64, messages=messages
    )
    message = raw.parse()
    out["create"] = {
        "status": raw.status_code,
        "request_id": raw.headers.get("x-request-id"),
        "content_type": raw.headers.get("content-type"),
        "id": message.id,
        "type": message.type,
        "role": message.role,
        "text": "".join(b.text for b in message.content if b.type == "text"),
        "stop_reason": message.stop_reason,
        "input_tokens": message.usage.input_tokens,
        "output_tokens": message.usage.output_tokens,
    }

    with client.messages.stream(model=model, max_tokens=64, messages=messages) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    out["stream"] = {
        "pieces": pieces,
        "id": final.id,
        "text": "".join(b.text for b in final.content if b.type == "text"),
        "stop_reason": final.stop_reason,
        "input_tokens": final.usage.input_tokens,
        "output_tokens": final.usage.output_tokens,
    }

    count = client.messages.count_tokens(model=model, messages=messages)
    out["count_tokens"] = {"input_tokens": count.input_tokens}

    bad = anthropic.Anthropic(
        base_url=base_url, api_key=os.environ["KEYPOOL_BAD_KEY"], max_retries=0, timeout=30.0
    )
    try:
        bad.messages.create(model=model, max_tokens=64, messages=messages)
        out["unauthorized"] = {"raised": None}
    except anthropic.APIStatusError as e:
        out["unauthorized"] = {
            "raised": type(e).__name__,
            "is_authentication_error": isinstance(e, anthropic.AuthenticationError),
            "status": e.status_code,
            "body": e.body,
            "request_id": e.response.headers.get("x-request-id"),
        }

    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
