// A fleetloop-following router in JavaScript (Node >= 18, no dependencies), written from the
// exported JSON Schema (schemas/json/Decision.json) alone: the worked example of README.md,
// "A router in another language". It does what fleetloop.router does for weights, by-priority
// weights, enforced open breakers, autoscale's drain list and prefix affinity; the rest (shed
// thresholds, spill-over, retry budget, fail static) follow the same pattern and are left out.
//
// Input, JSON lines on stdin:
//   {"key": "<kind>/<entity>", "value": <Decision>}   a record of control.state (key optional)
//   {"pick": {"pool": "chat", "priority": 0, "digest": null, "u": 0.42}}
// ("u" is the uniform draw in [0, 1) the weighted pick uses; a real router draws it itself.)
// Output: one JSON line per pick: {"node": "chat/1"} or {"node": null, "reason": "..."}.
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";

const here = new URL(".", import.meta.url);
const schema = JSON.parse(readFileSync(new URL("../../schemas/json/Decision.json", here), "utf8"));
const bodies = schema.properties.body.discriminator.mapping; // kind -> "#/$defs/<Model>"

// The checks a consumer in any language can take from the schema: required fields per model.
function validate(d) {
  for (const f of schema.required) if (!(f in d)) throw new Error(`missing ${f}`);
  const ref = bodies[d.body?.kind];
  if (!ref) throw new Error(`unknown body kind ${d.body?.kind}`);
  const model = schema.$defs[ref.split("/").pop()];
  for (const f of model.required ?? []) if (!(f in d.body)) throw new Error(`${d.body.kind}: missing ${f}`);
  for (const f of schema.$defs.PolicyStamp.required) if (!(f in d.policy)) throw new Error(`policy: missing ${f}`);
}

const held = new Map(); // key -> tick id: newest tick per key; an older one is dropped
const routing = new Map(); // pool -> RoutingDecision body
const breakers = new Map(); // node -> BreakerDecision body
const drains = new Map(); // pool -> Set of the nodes its newest autoscale decision drains

function accept(key, d) {
  if (d.policy.mode !== "enforce") return; // shadow decisions never act
  key ??= `${d.body.kind}/${d.body.entity}`; // the compaction key (Decision.key)
  if (held.has(key) && d.tick_id < held.get(key)) return;
  held.set(key, d.tick_id);
  if (d.body.kind === "routing") routing.set(d.body.pool_id, d.body);
  else if (d.body.kind === "breaker") breakers.set(d.body.node_id, d.body);
  else if (d.body.kind === "autoscale") drains.set(d.body.pool_id, new Set(d.body.drain ?? []));
}

const ejected = (node) => {
  const b = breakers.get(node);
  return b !== undefined && (b.enforced ?? true) && b.state === "open";
};

function pick({ pool, priority, digest, u }) {
  const r = routing.get(pool);
  if (!r) return { node: null, reason: "no-decision" }; // fall back to plain load balancing here
  const byP = r.by_priority?.[String(priority)];
  const weights = byP && Object.keys(byP).length ? byP : r.weights;
  // Sort by code point, as Python's sorted() does (not localeCompare).
  const ids = Object.keys(weights).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const drained = drains.get(pool) ?? new Set(); // held by the engine until gone or taken back
  const eligible = ids.filter((n) => weights[n] > 0 && !ejected(n) && !drained.has(n));
  if (eligible.length === 0) return { node: null, reason: "none-eligible" };
  for (const h of (digest && r.prefix_affinity?.[digest]) || []) if (eligible.includes(h)) return { node: h };
  if (eligible.length === 1) return { node: eligible[0] };
  let total = 0;
  for (const n of eligible) total += weights[n];
  const x = u * total;
  let acc = 0;
  for (const n of eligible) {
    acc += weights[n];
    if (x < acc) return { node: n };
  }
  return { node: eligible[eligible.length - 1] };
}

const out = [];
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const msg = JSON.parse(line);
  if (msg.pick) {
    out.push(JSON.stringify(pick(msg.pick)));
    continue;
  }
  const d = msg.value ?? msg;
  try {
    validate(d);
  } catch (e) {
    process.stderr.write(`dropped a record: ${e.message}\n`);
    continue;
  }
  accept(msg.key, d);
}
process.stdout.write(out.join("\n") + "\n");
