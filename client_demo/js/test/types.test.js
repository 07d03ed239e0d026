// types/protocol.d.ts is generated from docs/asyncapi.json: it must be in step with it, and
// the declarations must compile and describe the package's use (test/typecheck/usage.ts).

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { OUTPUT, SPEC, generate } from "../scripts/generate-types.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));

test("types/protocol.d.ts is what docs/asyncapi.json generates (npm run types)", () => {
  const spec = JSON.parse(readFileSync(SPEC, "utf8"));
  assert.equal(readFileSync(OUTPUT, "utf8"), generate(spec));
});

test("every frame and event type of the spec is declared", () => {
  const spec = JSON.parse(readFileSync(SPEC, "utf8"));
  const declared = readFileSync(OUTPUT, "utf8");
  for (const name of Object.keys(spec.components.schemas)) {
    assert.match(declared, new RegExp(`export (interface|type) ${name}\\b`));
  }
  for (const event of spec.components.schemas.EventType.enum) {
    assert.ok(declared.includes(`"${event}": `), `EventDataMap lacks ${event}`);
  }
});

test("the declarations compile under strict TypeScript and type a client's use", () => {
  const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
  try {
    execFileSync(process.execPath, [tsc, "-p", join(HERE, "typecheck", "tsconfig.json")], { encoding: "utf8" });
  } catch (error) {
    assert.fail(`tsc failed:\n${error.stdout}${error.stderr}`);
  }
});
