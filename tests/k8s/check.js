#!/usr/bin/env node
// Validates rendered Kubernetes manifests (multi-document YAML) offline
// against the Kubernetes API types of the pinned npm package
// kubernetes-models. Usage:
//
//   node check.js --check=schema|types|policy [--overlay=cpu|gpu|gpu-rdma] FILE.yaml
//
//   schema  JSON-schema validation (kubernetes-models' ajv validators):
//           required fields, value types, enums, formats (int32, ...).
//           These schemas allow unknown fields, hence:
//   types   a TypeScript type check of every object as an object literal of
//           its kubernetes-models interface (IStatefulSet, IJob, ...); the
//           excess-property check rejects unknown or misspelled fields at
//           any depth, and wrong value types.
//   policy  Harrier's own rules (counts agree with the ConfigMap, probes on
//           the gRPC port, non-root, resources set, ...).
//
// Prints the problems found, one a line, and exits 1 if there are any.
"use strict";

const fs = require("fs");
const path = require("path");
const YAML = require("yaml");

function usage() {
  process.stderr.write("usage: node check.js --check=schema|types|policy [--overlay=NAME] FILE.yaml\n");
  process.exit(2);
}

const args = process.argv.slice(2);
const checkArg = args.find((a) => a.startsWith("--check="));
const files = args.filter((a) => !a.startsWith("--"));
if (!checkArg || files.length !== 1) usage();
const check = checkArg.slice("--check=".length);
const overlayArg = args.find((a) => a.startsWith("--overlay="));
const overlay = overlayArg ? overlayArg.slice("--overlay=".length) : "";
const file = files[0];

// Parses every document; YAML errors are problems of their own.
function loadDocs(file) {
  const text = fs.readFileSync(file, "utf8");
  const problems = [];
  const docs = [];
  for (const doc of YAML.parseAllDocuments(text, { uniqueKeys: true })) {
    for (const e of doc.errors) problems.push(`YAML: ${e.message.split("\n")[0]}`);
    const obj = doc.toJS();
    if (obj !== null && obj !== undefined) docs.push(obj);
  }
  return { docs, problems };
}

function describe(obj, i) {
  const kind = obj && obj.kind ? obj.kind : "?";
  const name = obj && obj.metadata && obj.metadata.name ? obj.metadata.name : "?";
  return `doc ${i} ${kind}/${name}`;
}

// "apps/v1" + "StatefulSet" -> "kubernetes-models/apps/v1/StatefulSet".
function modelModule(obj) {
  if (!obj || typeof obj !== "object" || Array.isArray(obj)) return null;
  if (typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") return null;
  if (!/^[A-Za-z0-9.\-/]+$/.test(obj.apiVersion) || !/^[A-Za-z0-9]+$/.test(obj.kind)) return null;
  const spec = `kubernetes-models/${obj.apiVersion}/${obj.kind}`;
  try {
    require.resolve(spec);
    return spec;
  } catch (e) {
    return null;
  }
}

function checkSchema(docs) {
  const problems = [];
  docs.forEach((obj, i) => {
    const spec = modelModule(obj);
    if (!spec) {
      problems.push(`${describe(obj, i)}: unknown apiVersion/kind ${obj && obj.apiVersion}/${obj && obj.kind}`);
      return;
    }
    const Model = require(spec)[obj.kind];
    try {
      new Model(JSON.parse(JSON.stringify(obj))).validate();
    } catch (e) {
      for (const line of String(e.message).split("\n")) {
        if (line.trim()) problems.push(`${describe(obj, i)}: ${line.trim()}`);
      }
    }
  });
  return problems;
}

// Writes a value as TypeScript object-literal source, one property or
// element a line, remembering the JSON path of every line.
function emitLiteral(v, path, depth, head, tail, out) {
  const pad = "  ".repeat(depth);
  if (v !== null && typeof v === "object") {
    const isArr = Array.isArray(v);
    const entries = isArr ? v.map((x, i) => [i, x]) : Object.entries(v);
    if (entries.length === 0) {
      out.push([pad + head + (isArr ? "[]" : "{}") + tail, path]);
      return;
    }
    out.push([pad + head + (isArr ? "[" : "{"), path]);
    entries.forEach(([k, x], j) =>
      emitLiteral(x, path.concat([k]), depth + 1, isArr ? "" : JSON.stringify(k) + ": ",
        j < entries.length - 1 ? "," : "", out));
    out.push([pad + (isArr ? "]" : "}") + tail, path]);
  } else {
    out.push([pad + head + JSON.stringify(v) + tail, path]);
  }
}

function removePath(obj, path) {
  let parent = obj;
  for (const k of path.slice(0, -1)) parent = parent[k];
  const last = path[path.length - 1];
  if (Array.isArray(parent)) parent.splice(last, 1);
  else delete parent[last];
}

function checkTypes(docs) {
  const ts = require("typescript");
  const problems = [];
  // One virtual source file, next to node_modules so that imports resolve.
  const virtualPath = path.join(__dirname, "__rendered__.ts");
  const work = docs.map((d) => JSON.parse(JSON.stringify(d)));
  const known = [];
  work.forEach((obj, i) => {
    if (modelModule(obj)) known.push(i);
    else problems.push(`${describe(obj, i)}: unknown apiVersion/kind ${obj && obj.apiVersion}/${obj && obj.kind}`);
  });

  const options = {
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    types: [],
    lib: ["lib.es2020.d.ts"],
    target: ts.ScriptTarget.ES2020,
    module: ts.ModuleKind.Node16,
    moduleResolution: ts.ModuleResolutionKind.Node16,
  };
  let source = "";
  const host = ts.createCompilerHost(options);
  const same = (f) => path.resolve(f) === virtualPath;
  const getSourceFile = host.getSourceFile.bind(host);
  host.getSourceFile = (f, lang, ...rest) =>
    same(f) ? ts.createSourceFile(f, source, lang, true) : getSourceFile(f, lang, ...rest);
  const fileExists = host.fileExists.bind(host);
  host.fileExists = (f) => same(f) || fileExists(f);
  const readFile = host.readFile.bind(host);
  host.readFile = (f) => (same(f) ? source : readFile(f));

  // TypeScript reports one failure per declaration; to report them all,
  // drop each offending property and check again, until clean.
  const seen = new Set();
  const removed = []; // [docIndex, path] dropped in earlier rounds
  const isPrefix = (a, b) => a.length <= b.length && a.every((k, n) => k === b[n]);
  // "Property ... is missing" caused by our own removal of a wrong-typed
  // required field is no finding of its own.
  const MISSING = new Set([2739, 2740, 2741]);
  let program;
  for (let round = 0; round < 50; round++) {
    const lines = []; // [text, docIndex, path]
    for (const i of known) {
      const obj = work[i];
      lines.push([`import type { I${obj.kind} as T${i} } from ${JSON.stringify(modelModule(obj))};`, i, null]);
      lines.push([`export const doc${i}: T${i} =`, i, null]);
      const out = [];
      emitLiteral(obj, [], 1, "", ";", out);
      for (const [text, p] of out) lines.push([text, i, p]);
    }
    source = lines.map((l) => l[0]).join("\n") + "\n";
    program = ts.createProgram([virtualPath], options, host, program);
    const diags = ts.getPreEmitDiagnostics(program);
    const drop = new Map();
    for (const d of diags) {
      const msg = ts.flattenDiagnosticMessageText(d.messageText, " / ");
      if (!(d.file && same(d.file.fileName) && d.start !== undefined)) {
        problems.push(`typescript: ${msg}`);
        continue;
      }
      const { line } = d.file.getLineAndCharacterOfPosition(d.start);
      const [text, i, p] = lines[line];
      const ours = MISSING.has(d.code) && p && removed.some(([ri, rp]) => ri === i && isPrefix(p, rp));
      if (p && p.length > 0) drop.set(`${i}:${JSON.stringify(p)}`, [i, p]);
      if (ours) continue;
      const problem = `${describe(docs[i], i)}: \`${text.trim()}\`: ${msg}`;
      if (!seen.has(problem)) {
        seen.add(problem);
        problems.push(problem);
      }
    }
    if (drop.size === 0) break;
    // Deepest first, so that removals do not disturb each other.
    const order = [...drop.values()].sort((x, y) => y[1].length - x[1].length);
    for (const [i, p] of order) {
      try {
        removePath(work[i], p);
        removed.push([i, p]);
      } catch (e) {
        // an ancestor is already gone
      }
    }
  }
  return problems;
}

// Harrier's own rules on the rendered job.
function checkPolicy(docs) {
  const problems = [];
  const byKind = (k) => docs.filter((d) => d && d.kind === k);
  const one = (k, name) => {
    const found = byKind(k).filter((d) => d.metadata && d.metadata.name === name);
    if (found.length !== 1) problems.push(`expected exactly one ${k} ${name}, found ${found.length}`);
    return found[0];
  };
  const cms = byKind("ConfigMap").filter((d) => /^harrier-config(-[a-z0-9]+)?$/.test(d.metadata.name));
  if (cms.length !== 1) problems.push(`expected exactly one ConfigMap harrier-config, found ${cms.length}`);
  const data = (cms[0] && cms[0].data) || {};
  const shards = Number(data.HARRIER_NUM_SHARDS);
  const workers = Number(data.HARRIER_NUM_WORKERS);
  if (!(Number.isInteger(shards) && shards >= 1)) problems.push("HARRIER_NUM_SHARDS must be a positive integer");
  if (!(Number.isInteger(workers) && workers >= 1)) problems.push("HARRIER_NUM_WORKERS must be a positive integer");

  const sts = one("StatefulSet", "harrier-server");
  const svc = one("Service", "harrier-server");
  const job = one("Job", "harrier-worker");
  one("ServiceAccount", "harrier");
  one("PodDisruptionBudget", "harrier-server");
  one("NetworkPolicy", "harrier");

  if (svc && svc.spec.clusterIP !== "None") problems.push("Service harrier-server must be headless (clusterIP: None)");
  if (sts) {
    const s = sts.spec;
    if (s.replicas !== shards) problems.push(`StatefulSet replicas ${s.replicas} != HARRIER_NUM_SHARDS ${shards}`);
    if (s.podManagementPolicy !== "Parallel") problems.push("StatefulSet podManagementPolicy must be Parallel");
    if (s.serviceName !== "harrier-server") problems.push("StatefulSet serviceName must be harrier-server");
    const c = s.template.spec.containers[0];
    const grpcPort = (c.ports || []).find((p) => p.name === "grpc");
    if (!grpcPort) problems.push("server container has no port named grpc");
    // With --health_port the gRPC port wants TLS and the token, which
    // kubelet's probe cannot give: probes go to the plaintext health port.
    const healthFlag = containerWords(c).map((w) => /^--health_port=(\d+)$/.exec(w)).find((m) => m);
    let probePort = grpcPort;
    if (healthFlag) {
      probePort = (c.ports || []).find((p) => p.name === "health");
      if (!probePort) problems.push("server runs --health_port but declares no port named health");
      else if (probePort.containerPort !== Number(healthFlag[1])) problems.push(`server port health ${probePort.containerPort} != --health_port=${healthFlag[1]}`);
    } else if (tlsOn(data)) {
      problems.push("server serves TLS (HARRIER_TLS_CERT) but has no --health_port: kubelet's gRPC probe cannot pass");
    }
    for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      const p = c[probe];
      if (!p || !p.grpc) problems.push(`server ${probe} must be a grpc probe`);
      else if (probePort && p.grpc.port !== probePort.containerPort) problems.push(`server ${probe} port ${p.grpc.port} != ${probePort.name} port ${probePort.containerPort}`);
    }
  }
  if (job) {
    const s = job.spec;
    if (s.completionMode !== "Indexed") problems.push("Job completionMode must be Indexed");
    if (s.completions !== workers) problems.push(`Job completions ${s.completions} != HARRIER_NUM_WORKERS ${workers}`);
    if (s.parallelism !== workers) problems.push(`Job parallelism ${s.parallelism} != HARRIER_NUM_WORKERS ${workers}`);
  }
  for (const w of [sts, job]) {
    if (!w) continue;
    const pod = w.spec.template.spec;
    const where = `${w.kind}/${w.metadata.name}`;
    if (!pod.securityContext || pod.securityContext.runAsNonRoot !== true) problems.push(`${where}: pod must set runAsNonRoot: true`);
    if (typeof pod.terminationGracePeriodSeconds !== "number") problems.push(`${where}: terminationGracePeriodSeconds not set`);
    for (const c of pod.containers) {
      const r = c.resources || {};
      for (const k of ["cpu", "memory"]) {
        if (!r.requests || r.requests[k] === undefined) problems.push(`${where} ${c.name}: no ${k} request`);
        if (!r.limits || r.limits[k] === undefined) problems.push(`${where} ${c.name}: no ${k} limit`);
      }
      const sc = c.securityContext || {};
      if (sc.allowPrivilegeEscalation !== false) problems.push(`${where} ${c.name}: allowPrivilegeEscalation must be false`);
      if (!(sc.capabilities && (sc.capabilities.drop || []).includes("ALL"))) problems.push(`${where} ${c.name}: must drop ALL capabilities`);
      const refs = (c.envFrom || []).map((e) => e.configMapRef && e.configMapRef.name);
      if (!cms[0] || !refs.includes(cms[0].metadata.name)) problems.push(`${where} ${c.name}: must take envFrom the harrier-config ConfigMap`);
      problems.push(...checkSecretFiles(where, pod, c, data));
    }
  }
  if (overlay) problems.push(...checkOverlay(sts, job));
  return problems;
}

// The command line of a container, word by word (the wrapper scripts'
// text included, split on blanks and backslash-newlines).
function containerWords(c) {
  return [].concat(c.command || [], c.args || []).join(" ").split(/[\s\\]+/).filter((w) => w);
}

function tlsOn(data) {
  return Boolean(data.HARRIER_TLS_CERT || data.HARRIER_TLS_CA);
}

// Which Secret (and key) every file the ConfigMap names must come from.
const SECRET_FILES = {
  HARRIER_TLS_CERT: ["harrier-tls", "tls.crt"],
  HARRIER_TLS_KEY: ["harrier-tls", "tls.key"],
  HARRIER_TLS_CA: ["harrier-tls", "ca.crt"],
  HARRIER_AUTH_TOKEN_FILE: ["harrier-token", "token"],
};

// Every certificate, key and token file the ConfigMap points the binaries
// at is a key of the right Secret, mounted read-only where the path says,
// readable by the pod's user through the pod's fsGroup and by no one else
// (harrier refuses a world-readable token file).
function checkSecretFiles(where, pod, c, data) {
  const problems = [];
  for (const [env, [secret, key]] of Object.entries(SECRET_FILES)) {
    const file = data[env];
    if (!file) {
      problems.push(`${where} ${c.name}: ${env} not set in harrier-config (TLS and the job token are on by default)`);
      continue;
    }
    const dir = file.slice(0, file.lastIndexOf("/"));
    const base = file.slice(file.lastIndexOf("/") + 1);
    const mount = (c.volumeMounts || []).find((m) => m.mountPath === dir);
    if (!mount) {
      problems.push(`${where} ${c.name}: nothing mounted at ${dir} (${env}=${file})`);
      continue;
    }
    if (mount.readOnly !== true) problems.push(`${where} ${c.name}: mount ${dir} must be readOnly`);
    const volume = (pod.volumes || []).find((v) => v.name === mount.name);
    const projected = volume && volume.projected;
    const sources = projected ? projected.sources || [] : volume && volume.secret ? [{ secret: volume.secret }] : [];
    const item = sources
      .filter((src) => src.secret && (src.secret.name || src.secret.secretName) === secret)
      .flatMap((src) => src.secret.items || [])
      .find((i) => i.key === key && i.path === base);
    if (!item) {
      problems.push(`${where} ${c.name}: ${file} is not key ${key} of Secret ${secret}`);
      continue;
    }
    const mode = item.mode !== undefined ? item.mode : projected ? projected.defaultMode : volume.secret.defaultMode;
    if (mode === undefined || (mode & 0o007) !== 0) problems.push(`${where} ${c.name}: ${file} must not be readable by others (mode ${mode === undefined ? "default 0644" : "0" + mode.toString(8)})`);
    const sc = pod.securityContext || {};
    if ((mode === undefined || (mode & 0o040) !== 0) && sc.runAsUser !== 0 && sc.fsGroup === undefined) {
      problems.push(`${where}: pod must set fsGroup so that uid ${sc.runAsUser} can read ${file} through its group`);
    }
  }
  return problems;
}

// What each overlay promises (the policy check's --overlay=NAME).
function checkOverlay(sts, job) {
  const problems = [];
  if (!sts || !job) return problems;
  const server = sts.spec.template.spec.containers[0];
  const worker = job.spec.template.spec.containers[0];
  const limit = (c, k) => ((c.resources || {}).limits || {})[k];
  const hasArg = (c, a) => (c.args || []).includes(a);
  const caps = (c) => ((c.securityContext || {}).capabilities || {}).add || [];
  const env = (c, k) => ((c.env || []).find((e) => e.name === k) || {}).value;
  const gpu = overlay === "gpu" || overlay === "gpu-rdma";
  const rdma = overlay === "gpu-rdma";
  if (!["cpu", "gpu", "gpu-rdma"].includes(overlay)) return [`unknown overlay ${overlay}`];
  if (gpu) {
    if (!hasArg(worker, "--device=cuda")) problems.push("gpu: worker must run with --device=cuda");
    if (!(Number(limit(worker, "nvidia.com/gpu")) >= 1)) problems.push("gpu: worker needs an nvidia.com/gpu limit");
  } else {
    if (!hasArg(worker, "--device=cpu")) problems.push("cpu: worker must run with --device=cpu");
    if (limit(worker, "nvidia.com/gpu") !== undefined) problems.push("cpu: worker must not ask for a GPU");
  }
  if (limit(server, "nvidia.com/gpu") !== undefined) problems.push("servers must not ask for a GPU");
  if (rdma) {
    if (!hasArg(worker, "--transport=ucx")) problems.push("gpu-rdma: worker must run with --transport=ucx");
    for (const [role, c] of [["server", server], ["worker", worker]]) {
      if (!(Number(limit(c, "rdma/hca_shared_devices_a")) >= 1)) problems.push(`gpu-rdma: ${role} needs an rdma/hca_shared_devices_a limit`);
      if (!caps(c).includes("IPC_LOCK")) problems.push(`gpu-rdma: ${role} needs capability IPC_LOCK`);
      if (!env(c, "UCX_TLS") || !env(c, "UCX_NET_DEVICES")) problems.push(`gpu-rdma: ${role} needs UCX_TLS and UCX_NET_DEVICES`);
    }
    if (!/cuda_copy/.test(env(worker, "UCX_TLS") || "")) problems.push("gpu-rdma: worker UCX_TLS must include cuda_copy");
  } else if (!hasArg(worker, "--transport=grpc")) {
    problems.push(`${overlay}: worker must run with --transport=grpc`);
  }
  return problems;
}

const { docs, problems: parseProblems } = loadDocs(file);
let problems = parseProblems.slice();
if (docs.length === 0) problems.push("no Kubernetes objects in input");
if (check === "schema") problems = problems.concat(checkSchema(docs));
else if (check === "types") problems = problems.concat(checkTypes(docs));
else if (check === "policy") problems = problems.concat(checkPolicy(docs));
else usage();

for (const p of problems) process.stdout.write(`${p}\n`);
process.exit(problems.length ? 1 : 0);
