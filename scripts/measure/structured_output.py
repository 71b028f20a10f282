"""Structured output through ``coordinator serve``: every output validates against its JSON schema.

Three schemas (nested objects, enums, an array of objects) x ``--prompts``
prompts x T in {0, 1}, on the tool tests' random-weight Qwen3 pair drafting
locally (``tests.support.models.tool_models``): random weights write what the
grammar leaves them, so the grammar alone makes each output valid. Prints
how many validated, and the share of each generation spent processing the
logits (the grammar's masks, drafts' and verdicts').

    python scripts/measure/structured_output.py --prompts 20

Its figures are in ``docs/serving.md#measured-an-agent-loop-and-serve-beside-mlx_lmserver``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jsonschema

from tests.coordinator.serving.test_tools import SCHEMAS
from tests.support.models.tool_models import write_tool_pair
from tests.support.processes.servers import running_server


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=20)
    args = p.parse_args()
    target, draft = write_tool_pair(Path(tempfile.mkdtemp(prefix="structured-")))
    served = ["--target", str(target), "--draft", f"local:{draft}", "--model-name", "m"]
    valid = total = 0
    processing = generation = 0.0
    with running_server(*served, "--interface", "127.0.0.1") as server:
        client = server.client()
        for name, schema in SCHEMAS.items():
            response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
            for temperature in (0, 1):
                for i in range(args.prompts):
                    messages = [{"role": "user", "content": f"Request {i}: answer as JSON ({name})."}]
                    reply = client.chat.completions.create(
                        model="m", messages=messages, response_format=response_format,  # type: ignore[arg-type]
                        temperature=temperature, seed=i, max_tokens=160,
                    )  # fmt: skip
                    total += 1
                    try:
                        jsonschema.validate(json.loads(reply.choices[0].message.content or ""), schema)
                        valid += 1
                    except (json.JSONDecodeError, jsonschema.ValidationError) as err:
                        print(f"{name} T={temperature} #{i}: {err}")
                    figures = reply.model_extra["specwire"]  # type: ignore[index]
                    processing += figures.get("processing_s", 0.0)
                    generation += figures["generation_s"]
    print(
        f"{valid} of {total} outputs validate; processing {100 * processing / generation:.1f}% of generation"
    )
    return 0 if valid == total else 1


if __name__ == "__main__":
    sys.exit(main())
