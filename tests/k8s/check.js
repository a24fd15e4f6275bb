#!/usr/bin/env node
// Validates rendered Kubernetes manifests (multi-document YAML) offline.
// Usage:
//
//   node check.js --check=CHECK [--overlay=cpu|gpu|gpu-rdma|no-jobset|own-command]
//                 [--help-dir=DIR] FILE.yaml
//
//   schema  JSON-schema validation: the kubernetes-models ajv validators
//           for the core kinds (required fields, value types, enums,
//           formats); JobSets against jobset/v1alpha2.schema.json, each
//           replicated job's template as a batch/v1 Job, plus JobSet's CEL
//           rules. The core schemas allow unknown fields, hence:
//   types   a TypeScript type check of every object as an object literal of
//           its interface (kubernetes-models' IJob, ...; jobset/v1alpha2.ts
//           for JobSets); the excess-property check rejects unknown or
//           misspelled fields at any depth, and wrong value types.
//   refs    cross-references: Service/PDB/NetworkPolicy selectors against
//           pod template labels, named ports, volume mounts against
//           volumes, ConfigMap/PVC references, a JobSet's replicated-job
//           names, the entrypoints containers run against the
//           harrier-scripts ConfigMap, and every harrier-config key and
//           every argument of harrier-server, harrier-worker and
//           harrier-ctl against their
//           --help texts (DIR/<binary>.txt, made by validate.sh from the
//           built binaries; a missing text is a failure).
//   pss     Pod Security Standards, "baseline" and "restricted" levels, on
//           every pod template.
//   policy  Harrier's own rules (the JobSet or plain-Job shape, counts
//           agree with the ConfigMap, probes, secrets, what each overlay
//           promises).
//
// Prints the problems found, one a line, and exits 1 if there are any.
"use strict";

const fs = require("fs");
const path = require("path");
const YAML = require("yaml");

function usage() {
  process.stderr.write("usage: node check.js --check=schema|types|refs|pss|policy [--overlay=NAME] [--help-dir=DIR] FILE.yaml\n");
  process.exit(2);
}

const args = process.argv.slice(2);
const opt = (name) => {
  const a = args.find((x) => x.startsWith(`--${name}=`));
  return a === undefined ? "" : a.slice(name.length + 3);
};
const files = args.filter((a) => !a.startsWith("--"));
const check = opt("check");
if (!check || files.length !== 1) usage();
const overlay = opt("overlay");
const helpDir = opt("help-dir");
const file = files[0];

const JOBSET_API = "jobset.x-k8s.io/v1alpha2";
const isJobSet = (o) => Boolean(o) && o.apiVersion === JOBSET_API && o.kind === "JobSet";

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

// kubernetes-models validation of one object; problems prefixed by WHERE.
function validateModel(spec, obj, where) {
  const Model = require(spec)[obj.kind];
  try {
    new Model(JSON.parse(JSON.stringify(obj))).validate();
    return [];
  } catch (e) {
    return String(e.message).split("\n").filter((l) => l.trim()).map((l) => `${where}: ${l.trim()}`);
  }
}

let jobSetValidator = null;
function checkJobSetSchema(obj, where) {
  if (!jobSetValidator) {
    const Ajv = require("ajv");
    const ajv = new Ajv({ allErrors: true, strict: true });
    jobSetValidator = ajv.compile(require("./jobset/v1alpha2.schema.json"));
  }
  const problems = [];
  if (!jobSetValidator(obj)) {
    for (const e of jobSetValidator.errors) {
      const at = e.instancePath || "/";
      let msg = e.message;
      if (e.keyword === "additionalProperties") msg += ` ('${e.params.additionalProperty}')`;
      if (e.keyword === "enum") msg += ` (${e.params.allowedValues.join(", ")})`;
      problems.push(`${where}: ${at} ${msg}`);
    }
  }
  const rjs = ((obj && obj.spec) || {}).replicatedJobs;
  if (Array.isArray(rjs)) {
    // The embedded templates are batch/v1 JobTemplateSpecs: checked as Jobs.
    rjs.forEach((rj, n) => {
      if (!rj || typeof rj.template !== "object" || rj.template === null) return;
      const job = { apiVersion: "batch/v1", kind: "Job", metadata: rj.template.metadata || {}, spec: rj.template.spec };
      problems.push(...validateModel("kubernetes-models/batch/v1/Job", job, `${where}: spec/replicatedJobs/${n}/template (as batch/v1 Job)`));
    });
    // CEL rules of the CRD: names unique (listType map), and
    // startupPolicy InOrder excludes dependsOn.
    const names = rjs.map((rj) => rj && rj.name);
    names.forEach((nm, n) => {
      if (names.indexOf(nm) !== n) problems.push(`${where}: replicatedJobs name '${nm}' appears twice`);
    });
    const sp = obj.spec.startupPolicy;
    if (sp && sp.startupPolicyOrder === "InOrder" && rjs.some((rj) => rj && rj.dependsOn)) {
      problems.push(`${where}: startupPolicy InOrder and dependsOn are mutually exclusive`);
    }
  }
  return problems;
}

function checkSchema(docs) {
  const problems = [];
  docs.forEach((obj, i) => {
    if (isJobSet(obj)) {
      problems.push(...checkJobSetSchema(obj, describe(obj, i)));
      return;
    }
    const spec = modelModule(obj);
    if (!spec) {
      problems.push(`${describe(obj, i)}: unknown apiVersion/kind ${obj && obj.apiVersion}/${obj && obj.kind}`);
      return;
    }
    problems.push(...validateModel(spec, obj, describe(obj, i)));
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

// The TypeScript interface of an object: [module, interface name].
function typeOf(obj) {
  if (isJobSet(obj)) return ["./jobset/v1alpha2", "IJobSet"];
  const spec = modelModule(obj);
  return spec ? [spec, `I${obj.kind}`] : null;
}

function checkTypes(docs) {
  const ts = require("typescript");
  const problems = [];
  // One virtual source file, next to node_modules so that imports resolve.
  const virtualPath = path.join(__dirname, "__rendered__.ts");
  const work = docs.map((d) => JSON.parse(JSON.stringify(d)));
  const known = [];
  work.forEach((obj, i) => {
    if (typeOf(obj)) known.push(i);
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
      const [mod, iface] = typeOf(docs[i]);
      lines.push([`import type { ${iface} as T${i} } from ${JSON.stringify(mod)};`, i, null]);
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
        problems.push(`typescript: ${d.file ? path.basename(d.file.fileName) + ": " : ""}${msg}`);
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

// Every pod template of the rendered set: {where, owner, job (a Job spec
// or null), pod (the pod template: metadata + spec), role}.
function podTemplates(docs) {
  const out = [];
  const add = (where, owner, job, pod) => {
    if (!pod || typeof pod !== "object") return;
    const labels = (pod.metadata && pod.metadata.labels) || {};
    out.push({ where, owner, job, pod, spec: pod.spec || {}, labels, role: labels["app.kubernetes.io/component"] || "" });
  };
  for (const d of docs) {
    if (!d || !d.spec || !d.metadata) continue;
    const name = `${d.kind}/${d.metadata.name}`;
    if (isJobSet(d)) {
      for (const rj of d.spec.replicatedJobs || []) {
        const t = rj && rj.template && rj.template.spec;
        if (t) add(`${name} replicatedJob ${rj.name}`, d, t, t.template);
      }
    } else if (d.kind === "Job") {
      add(name, d, d.spec, d.spec.template);
    } else if (d.kind === "CronJob") {
      const t = d.spec.jobTemplate && d.spec.jobTemplate.spec;
      if (t) add(name, d, t, t.template);
    } else if (["StatefulSet", "Deployment", "DaemonSet", "ReplicaSet"].includes(d.kind)) {
      add(name, d, null, d.spec.template);
    } else if (d.kind === "Pod") {
      add(name, d, null, { metadata: d.metadata, spec: d.spec });
    }
  }
  return out;
}

const containersOf = (spec) => [].concat(spec.initContainers || [], spec.containers || []);

function labelsMatch(matchLabels, labels) {
  return Object.entries(matchLabels || {}).every(([k, v]) => labels[k] === v);
}

// A LabelSelector (matchLabels + matchExpressions) against labels.
function selectorMatches(sel, labels) {
  if (!sel) return false;
  if (!labelsMatch(sel.matchLabels, labels)) return false;
  for (const e of sel.matchExpressions || []) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    const vals = e.values || [];
    if (e.operator === "In" && !(has && vals.includes(labels[e.key]))) return false;
    if (e.operator === "NotIn" && has && vals.includes(labels[e.key])) return false;
    if (e.operator === "Exists" && !has) return false;
    if (e.operator === "DoesNotExist" && has) return false;
  }
  return true;
}

// Flags a --help text lists: lines "    --name (description...".
function helpFlags(text) {
  const flags = new Set();
  for (const m of text.matchAll(/^\s+--([A-Za-z0-9_]+) \(/gm)) flags.add(m[1]);
  return flags;
}

// Commands a --help text lists: "a|b|c" in a usage line, or the names
// of an indented "Commands:" block ("  name   what it does").
function helpCommands(text) {
  const commands = new Set();
  let inBlock = false;
  for (const line of text.split("\n")) {
    if (/^\s*usage:/i.test(line)) {
      for (const m of line.matchAll(/(?:^|\s)([a-z][a-z-]*(?:\|[a-z][a-z-]*)+)(?=\s|$)/g)) m[1].split("|").forEach((c) => commands.add(c));
    }
    if (/^\s*commands:\s*$/i.test(line)) {
      inBlock = true;
      continue;
    }
    const m = /^\s+([a-z][a-z-]*)\s{2,}\S/.exec(line);
    if (inBlock && m) commands.add(m[1]);
    else inBlock = false;
  }
  return commands;
}

// The help texts validate.sh wrote; {binary: {flags, text} | null}.
function loadHelp() {
  const help = {};
  for (const bin of ["harrier-server", "harrier-worker", "harrier-ctl"]) {
    const f = helpDir ? path.join(helpDir, `${bin}.txt`) : "";
    if (f && fs.existsSync(f)) {
      const text = fs.readFileSync(f, "utf8");
      const flags = helpFlags(text);
      help[bin] = flags.size ? { flags, text } : null;
    } else {
      help[bin] = null;
    }
  }
  return help;
}

// The harrier-config ConfigMap (kustomize may have hashed its name).
function harrierConfig(docs) {
  return docs.filter((d) => d && d.kind === "ConfigMap" && d.metadata && /^harrier-config(-[a-z0-9]+)?$/.test(d.metadata.name));
}
function harrierScripts(docs) {
  return docs.find((d) => d && d.kind === "ConfigMap" && d.metadata && /^harrier-scripts(-[a-z0-9]+)?$/.test(d.metadata.name));
}

// Flags written in an entrypoint script's commands (comments skipped).
function scriptFlags(text) {
  const out = [];
  for (const line of text.split("\n")) {
    const code = line.replace(/(^|\s)#.*$/, "");
    for (const m of code.matchAll(/(?:^|[\s"'])(--[A-Za-z0-9_]+)(?==|[\s"']|$)/g)) out.push(m[1]);
  }
  return out;
}

// Which binary a container runs: by the entrypoint script it starts or
// the binary in its command.
function binaryOf(c) {
  const words = [].concat(c.command || []).join(" ");
  if (/\/opt\/harrier\/server\.sh\b|\bharrier-server\b/.test(words)) return "harrier-server";
  if (/\/opt\/harrier\/worker\.sh\b|\bharrier-worker\b/.test(words)) return "harrier-worker";
  return "";
}

// Checks ARGS (words) against BIN's flags; WHERE names them.
function checkArgs(where, bin, words, help) {
  const problems = [];
  const h = help[bin];
  if (!h) return [`${where}: ${bin} not built: no --help text to check ${words.join(" ")} against`];
  for (const w of words) {
    const m = /^--([A-Za-z0-9_]+)(=.*)?$/.exec(w);
    if (!m) {
      problems.push(`${where}: argument '${w}' is not a --flag of ${bin}`);
      continue;
    }
    const name = m[1];
    // absl booleans also take --noname.
    const base = name.startsWith("no") && h.flags.has(name.slice(2)) ? name.slice(2) : name;
    if (!h.flags.has(base)) problems.push(`${where}: --${name} is no flag of ${bin} (its --help lists no --${name})`);
  }
  return problems;
}

function checkRefs(docs) {
  const problems = [];
  const pods = podTemplates(docs);
  const help = loadHelp();
  const configMaps = new Map(docs.filter((d) => d && d.kind === "ConfigMap").map((d) => [d.metadata.name, d]));
  const pvcs = new Set(docs.filter((d) => d && d.kind === "PersistentVolumeClaim").map((d) => d.metadata.name));

  // Selectors must select pods of this job.
  const selected = (sel) => pods.filter((p) => selectorMatches(sel, p.labels));
  for (const d of docs) {
    if (!d || !d.metadata) continue;
    const where = `${d.kind}/${d.metadata.name}`;
    if (d.kind === "Service" && d.spec && d.spec.selector) {
      const hit = selected({ matchLabels: d.spec.selector });
      if (hit.length === 0) {
        problems.push(`${where}: selector ${JSON.stringify(d.spec.selector)} matches no pod template`);
        continue;
      }
      for (const port of d.spec.ports || []) {
        for (const p of hit) {
          const cports = containersOf(p.spec).flatMap((c) => c.ports || []);
          const tp = port.targetPort === undefined ? port.port : port.targetPort;
          const ok = typeof tp === "string" ? cports.some((cp) => cp.name === tp) : cports.some((cp) => cp.containerPort === tp);
          if (!ok) problems.push(`${where}: port ${port.name || port.port} targetPort ${JSON.stringify(tp)} is no container port of ${p.where}`);
        }
      }
    } else if (d.kind === "PodDisruptionBudget" && d.spec) {
      if (selected(d.spec.selector).length === 0) problems.push(`${where}: selector ${JSON.stringify(d.spec.selector)} matches no pod template`);
    } else if (d.kind === "NetworkPolicy" && d.spec) {
      if (selected(d.spec.podSelector).length === 0) problems.push(`${where}: podSelector ${JSON.stringify(d.spec.podSelector)} matches no pod template`);
      // Peers without a namespaceSelector are pods of this namespace.
      for (const dir of ["ingress", "egress"]) {
        for (const rule of d.spec[dir] || []) {
          for (const peer of [].concat(rule.from || [], rule.to || [])) {
            if (peer.podSelector && !peer.namespaceSelector && selected(peer.podSelector).length === 0) {
              problems.push(`${where}: ${dir} peer podSelector ${JSON.stringify(peer.podSelector)} matches no pod template`);
            }
          }
        }
      }
    } else if (isJobSet(d)) {
      const names = (d.spec.replicatedJobs || []).map((rj) => rj.name);
      const known = (what, list) => {
        for (const n of list || []) if (!names.includes(n)) problems.push(`${where}: ${what} names replicated job '${n}', which does not exist (${names.join(", ")})`);
      };
      known("successPolicy.targetReplicatedJobs", (d.spec.successPolicy || {}).targetReplicatedJobs);
      for (const r of (d.spec.failurePolicy || {}).rules || []) known(`failurePolicy rule ${r.name}`, r.targetReplicatedJobs);
      if (d.spec.coordinator) known("coordinator", [d.spec.coordinator.replicatedJob]);
      for (const rj of d.spec.replicatedJobs || []) known(`replicatedJob ${rj.name} dependsOn`, (rj.dependsOn || []).map((x) => x.name));
    }
  }

  // Inside every pod template: mounts, named ports, ConfigMaps, PVCs, the
  // entrypoints.
  const entrypoints = harrierScripts(docs);
  for (const p of pods) {
    const volumes = new Map((p.spec.volumes || []).map((v) => [v.name, v]));
    const claimTemplates = p.owner.kind === "StatefulSet" ? (p.owner.spec.volumeClaimTemplates || []).map((t) => t.metadata.name) : [];
    for (const [name, v] of volumes) {
      if (v.configMap && !configMaps.has(v.configMap.name)) problems.push(`${p.where}: volume ${name} names ConfigMap ${v.configMap.name}, which is not rendered`);
      if (v.persistentVolumeClaim && !pvcs.has(v.persistentVolumeClaim.claimName)) problems.push(`${p.where}: volume ${name} names PersistentVolumeClaim ${v.persistentVolumeClaim.claimName}, which is not rendered`);
    }
    for (const c of containersOf(p.spec)) {
      const at = `${p.where} container ${c.name}`;
      const envNames = new Set((c.env || []).map((e) => e.name));
      for (const m of c.volumeMounts || []) {
        if (!volumes.has(m.name) && !claimTemplates.includes(m.name)) problems.push(`${at}: volumeMount ${m.name} (${m.mountPath}) names no volume of the pod`);
        for (const v of (m.subPathExpr || "").matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
          if (!envNames.has(v[1])) problems.push(`${at}: volumeMount ${m.name} subPathExpr uses $(${v[1]}), which the container's env does not define`);
        }
      }
      for (const e of c.envFrom || []) {
        if (e.configMapRef && !configMaps.has(e.configMapRef.name)) problems.push(`${at}: envFrom names ConfigMap ${e.configMapRef.name}, which is not rendered`);
      }
      for (const e of c.env || []) {
        const ref = e.valueFrom && e.valueFrom.configMapKeyRef;
        if (ref) {
          const cm = configMaps.get(ref.name);
          if (!cm) problems.push(`${at}: env ${e.name} names ConfigMap ${ref.name}, which is not rendered`);
          else if (!Object.prototype.hasOwnProperty.call(cm.data || {}, ref.key)) problems.push(`${at}: env ${e.name} names key ${ref.key}, which ConfigMap ${ref.name} does not have`);
        }
      }
      const portNames = new Set((c.ports || []).map((cp) => cp.name).filter((n) => n));
      for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
        const pr = c[probe];
        if (!pr) continue;
        for (const kind of ["httpGet", "tcpSocket", "grpc"]) {
          const port = pr[kind] && pr[kind].port;
          if (typeof port === "string" && !portNames.has(port)) problems.push(`${at}: ${probe} port '${port}' is no named port of the container`);
        }
        // exec probes with harrier-ctl: its flags and subcommand.
        const cmd = (pr.exec && pr.exec.command) || [];
        if (cmd.length && path.basename(cmd[0]) === "harrier-ctl") {
          const words = cmd.slice(1);
          const sub = words.filter((w) => !w.startsWith("-"));
          const h = help["harrier-ctl"];
          if (!h) {
            problems.push(`${at}: ${probe}: harrier-ctl not built: no --help text to check '${words.join(" ")}' against`);
          } else {
            problems.push(...checkArgs(`${at} ${probe}`, "harrier-ctl", words.filter((w) => w.startsWith("-")), help));
            const commands = helpCommands(h.text);
            for (const s of sub) {
              if (!commands.has(s)) problems.push(`${at}: ${probe}: '${s}' is no harrier-ctl command (its --help lists ${[...commands].join(", ") || "none"})`);
            }
          }
        }
      }
      for (const w of [].concat(c.command || [], c.args || [])) {
        const m = /^\/opt\/harrier\/([^/]+)$/.exec(w);
        if (m && (!entrypoints || !Object.prototype.hasOwnProperty.call(entrypoints.data || {}, m[1]))) {
          problems.push(`${at}: runs /opt/harrier/${m[1]}, which ConfigMap ${entrypoints ? entrypoints.metadata.name : "harrier-scripts"} does not have`);
        }
      }
      const bin = binaryOf(c);
      if (bin) problems.push(...checkArgs(`${at} args`, bin, c.args || [], help));
    }
  }

  // The entrypoint scripts' own flags.
  const scripts = harrierScripts(docs);
  if (scripts) {
    for (const [key, bin] of [["server.sh", "harrier-server"], ["worker.sh", "harrier-worker"]]) {
      const text = (scripts.data || {})[key];
      if (text === undefined) {
        problems.push(`ConfigMap ${scripts.metadata.name}: no ${key}`);
        continue;
      }
      problems.push(...checkArgs(`ConfigMap ${scripts.metadata.name} ${key}`, bin, scriptFlags(text), help));
    }
  }

  // Every harrier-config key is HARRIER_<FLAG> of either binary: both
  // ignore a HARRIER_* variable that is none of their flags, so a misspelt
  // key would silently do nothing.
  for (const cm of harrierConfig(docs)) {
    const server = help["harrier-server"];
    const worker = help["harrier-worker"];
    if (!server || !worker) {
      problems.push(`ConfigMap ${cm.metadata.name}: ${!server ? "harrier-server" : "harrier-worker"} not built: no --help text to check its keys against`);
      continue;
    }
    for (const key of Object.keys(cm.data || {})) {
      const m = /^HARRIER_([A-Z0-9_]+)$/.exec(key);
      const flag = m ? m[1].toLowerCase() : "";
      if (!m) problems.push(`ConfigMap ${cm.metadata.name}: key ${key} is not HARRIER_<FLAG>`);
      else if (!server.flags.has(flag) && !worker.flags.has(flag)) problems.push(`ConfigMap ${cm.metadata.name}: key ${key} is no flag of harrier-server or harrier-worker (no --${flag}): both would ignore it`);
    }
  }
  return problems;
}

// Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards),
// the baseline and restricted levels, on every pod template.
const BASELINE_CAPS = new Set(["AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
  "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"]);
const SAFE_SYSCTLS = new Set(["kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
  "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time",
  "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"]);
const RESTRICTED_VOLUMES = ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"];

function checkPss(docs) {
  const problems = [];
  for (const p of podTemplates(docs)) {
    const s = p.spec;
    const psc = s.securityContext || {};
    const bad = (level, msg) => problems.push(`${p.where}: Pod Security ${level}: ${msg}`);
    for (const f of ["hostNetwork", "hostPID", "hostIPC"]) if (s[f] === true) bad("baseline", `${f} must not be true`);
    for (const v of s.volumes || []) {
      if (v.hostPath) bad("baseline", `volume ${v.name}: hostPath volumes are not allowed`);
      const type = Object.keys(v).find((k) => k !== "name");
      if (!RESTRICTED_VOLUMES.includes(type)) bad("restricted", `volume ${v.name}: type ${type} is not allowed`);
    }
    for (const sc of psc.sysctls || []) if (!SAFE_SYSCTLS.has(sc.name)) bad("baseline", `sysctl ${sc.name} is not allowed`);
    const seccompOk = (sc) => sc && sc.seccompProfile && ["RuntimeDefault", "Localhost"].includes(sc.seccompProfile.type);
    if (psc.seccompProfile && psc.seccompProfile.type === "Unconfined") bad("baseline", "pod seccompProfile Unconfined");
    if (psc.runAsUser === 0) bad("restricted", "pod runAsUser 0");
    for (const c of containersOf(s)) {
      const sc = c.securityContext || {};
      const at = `container ${c.name}`;
      if (sc.privileged === true) bad("baseline", `${at}: privileged`);
      for (const cap of (sc.capabilities || {}).add || []) {
        if (!BASELINE_CAPS.has(cap)) bad("baseline", `${at}: adds capability ${cap}`);
        else if (cap !== "NET_BIND_SERVICE") bad("restricted", `${at}: adds capability ${cap} (only NET_BIND_SERVICE allowed)`);
      }
      if (!((sc.capabilities || {}).drop || []).includes("ALL")) bad("restricted", `${at}: must drop ALL capabilities`);
      for (const port of c.ports || []) if (port.hostPort) bad("baseline", `${at}: hostPort ${port.hostPort}`);
      if (sc.procMount && sc.procMount !== "Default") bad("baseline", `${at}: procMount ${sc.procMount}`);
      if (sc.seccompProfile && sc.seccompProfile.type === "Unconfined") bad("baseline", `${at}: seccompProfile Unconfined`);
      if (sc.appArmorProfile && sc.appArmorProfile.type === "Unconfined") bad("baseline", `${at}: appArmorProfile Unconfined`);
      if (sc.allowPrivilegeEscalation !== false) bad("restricted", `${at}: allowPrivilegeEscalation must be false`);
      if (sc.runAsNonRoot !== true && psc.runAsNonRoot !== true) bad("restricted", `${at}: runAsNonRoot must be true`);
      if (sc.runAsUser === 0) bad("restricted", `${at}: runAsUser 0`);
      if (!seccompOk(sc) && !seccompOk(psc)) bad("restricted", `${at}: seccompProfile must be RuntimeDefault or Localhost`);
    }
  }
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

const envOf = (c, k) => (c.env || []).find((e) => e.name === k);
const envValue = (c, k) => (envOf(c, k) || {}).value;
const fieldRefOf = (c, k) => {
  const e = envOf(c, k);
  return e && e.valueFrom && e.valueFrom.fieldRef ? e.valueFrom.fieldRef.fieldPath : undefined;
};

// Harrier's own rules on the rendered job, in either form: the JobSet
// (base, cpu, gpu, gpu-rdma) or two Indexed Jobs (no-jobset).
function checkPolicy(docs) {
  const problems = [];
  const byKind = (k) => docs.filter((d) => d && d.kind === k);
  const one = (k, name) => {
    const found = byKind(k).filter((d) => d.metadata && d.metadata.name === name);
    if (found.length !== 1) problems.push(`expected exactly one ${k} ${name}, found ${found.length}`);
    return found[0];
  };
  const cms = harrierConfig(docs);
  if (cms.length !== 1) problems.push(`expected exactly one ConfigMap harrier-config, found ${cms.length}`);
  const data = (cms[0] && cms[0].data) || {};
  const shards = Number(data.HARRIER_NUM_SHARDS);
  const workers = Number(data.HARRIER_NUM_WORKERS);
  if (!(Number.isInteger(shards) && shards >= 1)) problems.push("HARRIER_NUM_SHARDS must be a positive integer");
  if (!(Number.isInteger(workers) && workers >= 1)) problems.push("HARRIER_NUM_WORKERS must be a positive integer");
  one("ServiceAccount", "harrier");
  one("NetworkPolicy", "harrier");
  const scripts = harrierScripts(docs);
  if (!scripts) problems.push("expected a ConfigMap harrier-scripts (the entrypoints)");
  // A StatefulSet restarts pods that exit: shards that end with their job
  // would start an idle fresh run for ever.
  for (const s of byKind("StatefulSet")) problems.push(`StatefulSet/${s.metadata.name}: servers must run as Jobs (a StatefulSet never ends)`);
  for (const pdb of byKind("PodDisruptionBudget")) {
    if (pdb.spec.maxUnavailable === 0 || pdb.spec.maxUnavailable === "0%") problems.push(`PodDisruptionBudget/${pdb.metadata.name}: maxUnavailable 0 blocks node drains for the whole job`);
    if (pdb.spec.minAvailable !== undefined) problems.push(`PodDisruptionBudget/${pdb.metadata.name}: use maxUnavailable, not minAvailable`);
  }

  const jobsets = byKind("JobSet");
  let server = null; // {where, job, pod, spec}
  let worker = null;
  let serverPrefix = "";
  let serverSuffix = "";
  const indexed = (job, where) => {
    if (job.completionMode !== "Indexed") problems.push(`${where}: completionMode must be Indexed`);
  };
  if (jobsets.length) {
    const js = one("JobSet", "harrier");
    if (overlay === "no-jobset") problems.push("no-jobset: must not render a JobSet");
    if (js) {
      const s = js.spec || {};
      const where = `JobSet/${js.metadata.name}`;
      const rjs = s.replicatedJobs || [];
      const names = rjs.map((rj) => rj.name);
      if (names.join(",") !== "server,worker") problems.push(`${where}: replicatedJobs must be [server, worker] in that order (InOrder starts servers first), found [${names.join(", ")}]`);
      if (!s.startupPolicy || s.startupPolicy.startupPolicyOrder !== "InOrder") problems.push(`${where}: startupPolicy.startupPolicyOrder must be InOrder`);
      const sp = s.successPolicy || {};
      if (sp.operator !== "All" || JSON.stringify(sp.targetReplicatedJobs) !== JSON.stringify(["worker"])) problems.push(`${where}: successPolicy must be operator All on [worker]`);
      if (!s.failurePolicy || !(s.failurePolicy.maxRestarts >= 1)) problems.push(`${where}: failurePolicy.maxRestarts must be >= 1`);
      if (typeof s.ttlSecondsAfterFinished !== "number") problems.push(`${where}: ttlSecondsAfterFinished not set`);
      const net = s.network || {};
      if (net.enableDNSHostnames !== true) problems.push(`${where}: network.enableDNSHostnames must be true (workers dial shards by name)`);
      const subdomain = net.subdomain || js.metadata.name;
      const rs = rjs.find((rj) => rj.name === "server");
      const rw = rjs.find((rj) => rj.name === "worker");
      for (const rj of [rs, rw]) {
        if (rj && rj.template.spec.ttlSecondsAfterFinished !== undefined) problems.push(`${where} replicatedJob ${rj.name}: no TTL of its own (the JobSet's is the one TTL)`);
      }
      if (rs) {
        const job = rs.template.spec;
        const w = `${where} replicatedJob server`;
        if (rs.replicas !== shards) problems.push(`${w}: replicas ${rs.replicas} != HARRIER_NUM_SHARDS ${shards}`);
        if (job.completions !== 1 || job.parallelism !== 1) problems.push(`${w}: one pod per Job (completions and parallelism 1)`);
        indexed(job, w);
        server = { where: w, job, pod: job.template.spec, podMeta: job.template.metadata };
        const c = (server.pod.containers || [])[0] || {};
        if (fieldRefOf(c, "SHARD_INDEX") !== "metadata.annotations['jobset.sigs.k8s.io/job-index']") problems.push(`${w}: SHARD_INDEX must come from the jobset.sigs.k8s.io/job-index annotation`);
        if (fieldRefOf(c, "RUN_ID") !== "metadata.labels['jobset.sigs.k8s.io/jobset-uid']") problems.push(`${w}: RUN_ID must come from the jobset.sigs.k8s.io/jobset-uid label`);
        if (fieldRefOf(c, "RESTART_ATTEMPT") !== "metadata.labels['jobset.sigs.k8s.io/restart-attempt']") problems.push(`${w}: RESTART_ATTEMPT must come from the jobset.sigs.k8s.io/restart-attempt label`);
      }
      if (rw) {
        const job = rw.template.spec;
        const w = `${where} replicatedJob worker`;
        if (rw.replicas !== 1) problems.push(`${w}: replicas must be 1 (one Indexed Job of all workers)`);
        indexed(job, w);
        if (job.completions !== workers) problems.push(`${w}: completions ${job.completions} != HARRIER_NUM_WORKERS ${workers}`);
        if (job.parallelism !== workers) problems.push(`${w}: parallelism ${job.parallelism} != HARRIER_NUM_WORKERS ${workers}`);
        worker = { where: w, job, pod: job.template.spec, podMeta: job.template.metadata };
      }
      // Pod i of server Job j is <jobset>-server-<j>-<i>.<subdomain>.
      serverPrefix = `${js.metadata.name}-server-`;
      serverSuffix = `-0.${subdomain}:`;
    }
  } else {
    const sj = one("Job", "harrier-server");
    const wj = one("Job", "harrier-worker");
    const svc = one("Service", "harrier-server");
    if (svc && svc.spec.clusterIP !== "None") problems.push("Service harrier-server must be headless (clusterIP: None)");
    if (sj) {
      const w = "Job/harrier-server";
      indexed(sj.spec, w);
      if (sj.spec.completions !== shards) problems.push(`${w}: completions ${sj.spec.completions} != HARRIER_NUM_SHARDS ${shards}`);
      if (sj.spec.parallelism !== shards) problems.push(`${w}: parallelism ${sj.spec.parallelism} != HARRIER_NUM_SHARDS ${shards}`);
      server = { where: w, job: sj.spec, pod: sj.spec.template.spec, podMeta: sj.spec.template.metadata };
      if (svc && server.pod.subdomain !== svc.metadata.name) problems.push(`${w}: pod subdomain ${server.pod.subdomain} != headless Service ${svc.metadata.name}`);
      const c = (server.pod.containers || [])[0] || {};
      if (fieldRefOf(c, "SHARD_INDEX") !== "metadata.annotations['batch.kubernetes.io/job-completion-index']") problems.push(`${w}: SHARD_INDEX must come from the job-completion-index annotation`);
      if (fieldRefOf(c, "RUN_ID") !== "metadata.labels['batch.kubernetes.io/controller-uid']") problems.push(`${w}: RUN_ID must come from the controller-uid label`);
    }
    if (wj) {
      const w = "Job/harrier-worker";
      indexed(wj.spec, w);
      if (wj.spec.completions !== workers) problems.push(`${w}: completions ${wj.spec.completions} != HARRIER_NUM_WORKERS ${workers}`);
      if (wj.spec.parallelism !== workers) problems.push(`${w}: parallelism ${wj.spec.parallelism} != HARRIER_NUM_WORKERS ${workers}`);
      worker = { where: w, job: wj.spec, pod: wj.spec.template.spec, podMeta: wj.spec.template.metadata };
    }
    serverPrefix = "harrier-server-";
    serverSuffix = `.${svc ? svc.metadata.name : "?"}:`;
  }

  const scriptText = (k) => (scripts && scripts.data && scripts.data[k]) || "";
  const serverFlags = scriptText("server.sh").split(/[\s\\"]+/).concat(server ? containerWords((server.pod.containers || [])[0] || {}) : []);
  const flagValue = (words, name) => {
    const hits = words.map((w) => new RegExp(`^--${name}=(.*)$`).exec(w)).filter((m) => m);
    return hits.length ? hits[hits.length - 1][1] : undefined;
  };
  if (server) {
    const c = (server.pod.containers || [])[0];
    const w = server.where;
    if (!c) problems.push(`${w}: no container`);
    else {
      if (!containerWords(c).includes("/opt/harrier/server.sh")) problems.push(`${w}: must run /opt/harrier/server.sh`);
      const grpcPort = (c.ports || []).find((p) => p.name === "grpc");
      if (!grpcPort) problems.push("server container has no port named grpc");
      if (grpcPort && Number(flagValue(serverFlags, "port")) !== grpcPort.containerPort) problems.push(`server --port=${flagValue(serverFlags, "port")} != port grpc ${grpcPort.containerPort}`);
      const exitWhenDone = flagValue(serverFlags, "exit_when_done");
      if (exitWhenDone !== undefined && exitWhenDone !== "true") problems.push(`server runs --exit_when_done=${exitWhenDone}: the shards would never end`);
      if (server.pod.restartPolicy === "Always") problems.push(`${w}: restartPolicy Always never ends`);
      // With --health_port the gRPC port wants TLS and the token, which
      // kubelet cannot give: probes go to the plaintext health port.
      const health = flagValue(serverFlags, "health_port");
      let probePort = grpcPort ? grpcPort.containerPort : undefined;
      if (health !== undefined) {
        const hp = (c.ports || []).find((p) => p.name === "health");
        if (!hp) problems.push("server runs --health_port but declares no port named health");
        else if (hp.containerPort !== Number(health)) problems.push(`server port health ${hp.containerPort} != --health_port=${health}`);
        probePort = Number(health);
      } else if (tlsOn(data)) {
        problems.push("server serves TLS (HARRIER_TLS_CERT) but has no --health_port: kubelet's probes cannot pass");
      }
      for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
        const p = c[probe];
        const cmd = (p && p.exec && p.exec.command) || [];
        if (!p) problems.push(`server has no ${probe}`);
        else if (path.basename(cmd[0] || "") !== "harrier-ctl" || !cmd.includes("health")) problems.push(`server ${probe} must be an exec probe: harrier-ctl health`);
        else {
          const target = (cmd.find((x) => x.startsWith("--servers=")) || "").slice("--servers=".length);
          if (target !== `127.0.0.1:${probePort}`) problems.push(`server ${probe} probes ${target || "nothing"}, not the health port 127.0.0.1:${probePort}`);
          if (!cmd.some((x) => /^--timeout_ms=\d+$/.test(x))) problems.push(`server ${probe}: harrier-ctl needs --timeout_ms`);
          else if (Number(cmd.find((x) => x.startsWith("--timeout_ms=")).slice(13)) >= 1000 * (p.timeoutSeconds || 1)) problems.push(`server ${probe}: --timeout_ms must be below timeoutSeconds`);
        }
      }
      // Per-shard checkpoints: the checkpoint folder is a volume, one
      // sub-folder per shard.
      const dir = data.HARRIER_CHECKPOINT_DIR;
      if (dir) {
        const m = (c.volumeMounts || []).find((x) => x.mountPath === dir);
        if (!m) problems.push(`${w}: nothing mounted at HARRIER_CHECKPOINT_DIR ${dir}`);
        else if (!/\$\(SHARD_INDEX\)/.test(m.subPathExpr || "")) problems.push(`${w}: checkpoint mount needs subPathExpr with $(SHARD_INDEX) (one folder per shard)`);
      }
    }
  }
  if (worker) {
    const c = (worker.pod.containers || [])[0];
    if (c) {
      // harrier-worker (worker.sh), or a command of your own (run.sh, which
      // execs the container's args).
      const ownCommand = containerWords(c).includes("/opt/harrier/run.sh");
      if (!containerWords(c).includes("/opt/harrier/worker.sh") && !ownCommand) {
        problems.push(`${worker.where}: must run /opt/harrier/worker.sh (harrier-worker) or /opt/harrier/run.sh (a command of your own)`);
      }
      const args = c.args || [];
      if (ownCommand && args.length === 0) problems.push(`${worker.where}: /opt/harrier/run.sh needs a command to run (the container's args)`);
      if (ownCommand && args.length > 0 && String(args[0]).startsWith("-")) {
        problems.push(`${worker.where}: /opt/harrier/run.sh runs a command, not harrier-worker flags (args start with ${args[0]})`);
      }
      const grpc = server && ((server.pod.containers || [])[0].ports || []).find((p) => p.name === "grpc");
      const wantSuffix = serverSuffix + (grpc ? grpc.containerPort : "?");
      if (envValue(c, "SERVER_PREFIX") !== serverPrefix || envValue(c, "SERVER_SUFFIX") !== wantSuffix) {
        problems.push(`${worker.where}: shard names ${envValue(c, "SERVER_PREFIX")}<i>${envValue(c, "SERVER_SUFFIX")} are not the server pods' ${serverPrefix}<i>${wantSuffix}`);
      }
    }
  }
  for (const w of [server, worker]) {
    if (!w) continue;
    const pod = w.pod;
    const where = w.where;
    if (!pod.securityContext || pod.securityContext.runAsNonRoot !== true) problems.push(`${where}: pod must set runAsNonRoot: true`);
    if (typeof pod.terminationGracePeriodSeconds !== "number") problems.push(`${where}: terminationGracePeriodSeconds not set`);
    for (const c of pod.containers || []) {
      const r = c.resources || {};
      for (const k of ["cpu", "memory"]) {
        if (!r.requests || r.requests[k] === undefined) problems.push(`${where} ${c.name}: no ${k} request`);
        if (!r.limits || r.limits[k] === undefined) problems.push(`${where} ${c.name}: no ${k} limit`);
      }
      const sc = c.securityContext || {};
      if (sc.allowPrivilegeEscalation !== false) problems.push(`${where} ${c.name}: allowPrivilegeEscalation must be false`);
      if (!(sc.capabilities && (sc.capabilities.drop || []).includes("ALL"))) problems.push(`${where} ${c.name}: must drop ALL capabilities`);
      // Added capabilities reach a non-root process only in its bounding
      // set: useless, and IPC_LOCK fails Pod Security baseline.
      for (const cap of (sc.capabilities || {}).add || []) problems.push(`${where} ${c.name}: adds capability ${cap} (useless for a non-root process; memlock comes from the runtime)`);
      const refs = (c.envFrom || []).map((e) => e.configMapRef && e.configMapRef.name);
      if (!cms[0] || !refs.includes(cms[0].metadata.name)) problems.push(`${where} ${c.name}: must take envFrom the harrier-config ConfigMap`);
      const mount = (c.volumeMounts || []).find((m) => m.mountPath === "/opt/harrier");
      const vol = mount && (pod.volumes || []).find((v) => v.name === mount.name);
      if (!vol || !vol.configMap || !scripts || vol.configMap.name !== scripts.metadata.name) problems.push(`${where} ${c.name}: must mount the harrier-scripts ConfigMap at /opt/harrier`);
      problems.push(...checkSecretFiles(where, pod, c, data));
    }
  }
  if (overlay) problems.push(...checkOverlay(server, worker));
  return problems;
}

// What each overlay promises (the policy check's --overlay=NAME).
function checkOverlay(serverW, workerW) {
  const problems = [];
  if (!serverW || !workerW) return problems;
  const server = serverW.pod.containers[0];
  const worker = workerW.pod.containers[0];
  const limit = (c, k) => ((c.resources || {}).limits || {})[k];
  const hasArg = (c, a) => (c.args || []).includes(a);
  const tag = (c) => (/:([^:/]+)$/.exec(c.image || "") || [])[1] || "";
  const gpu = overlay === "gpu" || overlay === "gpu-rdma";
  const rdma = overlay === "gpu-rdma";
  if (!["cpu", "gpu", "gpu-rdma", "no-jobset", "own-command"].includes(overlay)) return [`unknown overlay ${overlay}`];
  if (overlay === "own-command") {
    // Your image and command as the workers, Harrier's shards as they are.
    const repo = (image) => {
      const s = String(image || "").split("@")[0];
      const slash = s.lastIndexOf("/");
      const colon = s.lastIndexOf(":");
      return (colon > slash ? s.slice(0, colon) : s).slice(slash + 1);
    };
    if (!containerWords(worker).includes("/opt/harrier/run.sh")) problems.push("own-command: worker must run /opt/harrier/run.sh with your command");
    if (repo(worker.image) === "harrier") problems.push(`own-command: worker must run your image, not Harrier's (${worker.image})`);
    if (repo(server.image) !== "harrier") problems.push(`own-command: servers run Harrier's image, not ${server.image}`);
    const annotations = (workerW.podMeta && workerW.podMeta.annotations) || {};
    if (annotations["prometheus.io/scrape"] !== "false") problems.push("own-command: worker pods serve no Harrier metrics (prometheus.io/scrape must be \"false\")");
    if (hasArg(server, "--ucx")) problems.push("own-command: servers need no --ucx");
    if (limit(server, "nvidia.com/gpu") !== undefined) problems.push("servers must not ask for a GPU");
    return problems;
  }
  if (gpu) {
    if (!hasArg(worker, "--device=cuda")) problems.push("gpu: worker must run with --device=cuda");
    if (!(Number(limit(worker, "nvidia.com/gpu")) >= 1)) problems.push("gpu: worker needs an nvidia.com/gpu limit");
    if (!/-cuda$/.test(tag(worker))) problems.push(`gpu: worker must run the CUDA image (tag *-cuda), not ${worker.image}`);
    if (/-cuda$/.test(tag(server))) problems.push(`gpu: servers run on CPU nodes with the plain image, not ${server.image}`);
  } else {
    if (!hasArg(worker, "--device=cpu")) problems.push(`${overlay}: worker must run with --device=cpu`);
    if (limit(worker, "nvidia.com/gpu") !== undefined) problems.push(`${overlay}: worker must not ask for a GPU`);
    if (/-cuda$/.test(tag(worker))) problems.push(`${overlay}: worker needs no CUDA image`);
  }
  if (limit(server, "nvidia.com/gpu") !== undefined) problems.push("servers must not ask for a GPU");
  if (rdma) {
    if (!hasArg(worker, "--transport=ucx")) problems.push("gpu-rdma: worker must run with --transport=ucx");
    if (!hasArg(server, "--ucx")) problems.push("gpu-rdma: servers must run with --ucx (else every UCX worker fails)");
    for (const [role, c] of [["server", server], ["worker", worker]]) {
      if (!(Number(limit(c, "rdma/hca_shared_devices_a")) >= 1)) problems.push(`gpu-rdma: ${role} needs an rdma/hca_shared_devices_a limit`);
      if (envValue(c, "MEMLOCK_CHECK") !== "error") problems.push(`gpu-rdma: ${role} needs MEMLOCK_CHECK=error (stop on a small memlock limit)`);
      if (!envValue(c, "UCX_TLS") || !envValue(c, "UCX_NET_DEVICES")) problems.push(`gpu-rdma: ${role} needs UCX_TLS and UCX_NET_DEVICES`);
    }
    if (!/cuda_copy/.test(envValue(worker, "UCX_TLS") || "")) problems.push("gpu-rdma: worker UCX_TLS must include cuda_copy");
  } else {
    if (!hasArg(worker, "--transport=grpc")) problems.push(`${overlay}: worker must run with --transport=grpc`);
    if (hasArg(server, "--ucx")) problems.push(`${overlay}: servers need no --ucx`);
  }
  return problems;
}

const { docs, problems: parseProblems } = loadDocs(file);
let problems = parseProblems.slice();
if (docs.length === 0) problems.push("no Kubernetes objects in input");
const checks = { schema: checkSchema, types: checkTypes, refs: checkRefs, pss: checkPss, policy: checkPolicy };
if (!checks[check]) usage();
problems = problems.concat(checks[check](docs));

for (const p of problems) process.stdout.write(`${p}\n`);
process.exit(problems.length ? 1 : 0);
