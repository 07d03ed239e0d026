// The package as `npm pack` builds it installs into an empty project and works from there:
// the modules, the declarations, and nothing a runtime would need to download.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const PACKAGE = dirname(dirname(fileURLToPath(import.meta.url)));
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

test("npm pack builds a package that installs offline and imports in Node", () => {
  const dir = mkdtempSync(join(tmpdir(), "agw-pack-"));
  try {
    const packed = JSON.parse(execFileSync(npm, ["pack", "--json", "--pack-destination", dir], { cwd: PACKAGE, encoding: "utf8" }));
    const files = packed[0].files.map((f) => f.path);
    assert.ok(files.includes("src/index.js") && files.includes("src/react.js"));
    assert.ok(files.includes("types/protocol.d.ts") && files.includes("types/index.d.ts"));
    assert.ok(!files.some((f) => f.startsWith("test/") || f.startsWith("node_modules/")), files.join(", "));
    // The license the package declares goes with it, and the README's links lead to files
    // the package holds: inside node_modules, or on a registry's page, nothing else is there.
    assert.ok(files.includes("LICENSE"), files.join(", "));
    const links = [...readFileSync(join(PACKAGE, "README.md"), "utf8").matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1]);
    assert.ok(links.length > 0);
    for (const link of links) assert.ok(files.includes(link), `README links to ${link}, which the package does not hold`);

    const app = join(dir, "app");
    execFileSync("mkdir", ["-p", app]);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
    execFileSync(npm, ["install", "--offline", "--no-audit", "--no-fund", "--ignore-scripts", join(dir, packed[0].filename)], { cwd: app, encoding: "utf8" });
    const installed = join(app, "node_modules", "agents-ws-gateway-client");
    assert.ok(existsSync(join(installed, "types", "protocol.d.ts")));
    assert.ok(readFileSync(join(app, "package.json"), "utf8").includes("agents-ws-gateway-client"));
    assert.ok(!existsSync(join(app, "node_modules", "react")), "React is an optional peer, not installed");
    const out = execFileSync(
      process.execPath,
      ["--input-type=module", "-e", `import * as m from "agents-ws-gateway-client"; console.log(Object.keys(m).sort().join(","));`],
      { cwd: app, encoding: "utf8" },
    );
    for (const name of ["GatewayClient", "applyEvent", "memoryStore", "webStorageStore"]) assert.ok(out.trim().split(",").includes(name), out);

    // TypeScript as a new project has it: no module settings, so TypeScript 5's default
    // resolution (node10), which reads no `exports`; and as a bundler app (Vite) has it.
    writeFileSync(
      join(app, "main.ts"),
      `import { GatewayClient } from "agents-ws-gateway-client";
import type { UseThread } from "agents-ws-gateway-client/react";
import type { WelcomeFrame } from "agents-ws-gateway-client/protocol";
export const client: GatewayClient = new GatewayClient({ url: "ws://127.0.0.1:8000/v1/ws", token: "jwt" });
export type Connection = UseThread["connection"];
export type Roles = WelcomeFrame["roles"];
`,
    );
    const tsc = join(PACKAGE, "node_modules", "typescript", "bin", "tsc");
    for (const options of [{}, { module: "esnext", moduleResolution: "bundler" }]) {
      const compilerOptions = { strict: true, noEmit: true, lib: ["ES2022", "DOM"], types: [], ...options };
      writeFileSync(join(app, "tsconfig.json"), JSON.stringify({ compilerOptions, files: ["main.ts"] }));
      try {
        execFileSync(process.execPath, [tsc, "-p", app], { cwd: app, encoding: "utf8" });
      } catch (error) {
        assert.fail(`tsc with ${JSON.stringify(options)} failed:\n${error.stdout}${error.stderr}`);
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
