// Builds the example into dist/ (gitignored): app.jsx bundled with React, `ai` and
// @ai-sdk/react as package-lock.json pins them, beside index.html and app.css. dev.py runs it
// (`node build.mjs`) when a source or the lockfile changed; the demo gateway serves dist/ at
// /examples/ai-sdk/.
import { copyFile, mkdir, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "dist");

await rm(out, { recursive: true, force: true });
await mkdir(out, { recursive: true });
await build({
  entryPoints: [join(here, "app.jsx")],
  outfile: join(out, "app.js"),
  bundle: true,
  minify: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  jsx: "automatic",
  // React's production build: the development one is larger and warns in the console.
  define: { "process.env.NODE_ENV": '"production"' },
  logLevel: "warning",
});
await copyFile(join(here, "index.html"), join(out, "index.html"));
await copyFile(join(here, "app.css"), join(out, "app.css"));
