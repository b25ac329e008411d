// k8s_schema.mjs - validates rendered Kubernetes manifests against the
// Kubernetes API schemas, offline: the npm package kubernetes-models
// (JSON schemas generated from the Kubernetes OpenAPI spec, compiled to
// ajv validators) checks every object's types, required fields, enums and
// formats.  An object whose apiVersion/kind has no schema there is an
// error, not a skip.
//
// usage: node k8s_schema.mjs NODE_MODULES_DIR RENDERED.yaml...
// Prints "ok FILE: N objects (kinds)" per file, or one line per error
// ("FAIL FILE: Kind/name: /json/path message"); exits 1 on any error.
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [nm, ...files] = process.argv.slice(2);
if (!nm || files.length === 0) {
  console.error("usage: node k8s_schema.mjs NODE_MODULES_DIR RENDERED.yaml...");
  process.exit(2);
}
const yaml = createRequire(join(nm, "..", "package.json"))("js-yaml");
const models = join(nm, "kubernetes-models");

// apps/v1 + Deployment -> kubernetes-models/apps/v1/Deployment.js;
// the core group (apiVersion "v1") lives in kubernetes-models/v1.
async function modelOf(apiVersion, kind) {
  const file = join(models, ...String(apiVersion).split("/"), `${kind}.js`);
  if (!existsSync(file)) return null;
  const mod = await import(pathToFileURL(file));
  return mod[kind] ?? null;
}

let failed = 0;
for (const f of files) {
  const docs = yaml.loadAll(readFileSync(f, "utf8")).filter((d) => d);
  const kinds = new Set();
  const errs = [];
  for (const d of docs) {
    const id = `${d.kind}/${d.metadata?.name}`;
    const Model = await modelOf(d.apiVersion, d.kind);
    if (!Model) {
      errs.push(`${id}: no schema for apiVersion ${d.apiVersion} kind ${d.kind}`);
      continue;
    }
    try {
      new Model(d).validate();
      kinds.add(d.kind);
    } catch (e) {
      const list = e.errors ?? [{ instancePath: "", message: e.message }];
      for (const x of list) {
        const extra = x.params && Object.keys(x.params).length
          ? ` ${JSON.stringify(x.params)}` : "";
        errs.push(`${id}: ${x.instancePath || "/"} ${x.message}${extra}`);
      }
    }
  }
  for (const e of errs) console.log(`FAIL ${f}: ${e}`);
  if (errs.length === 0)
    console.log(`ok ${f}: ${docs.length} objects (${[...kinds].sort().join(", ")})`);
  failed += errs.length;
}
process.exit(failed ? 1 : 0);
