// /docs: every operation of /openapi.json, its summary, description and
// request schema, written with textContent (no markup from the document).
"use strict";

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

async function show() {
  const ops = document.getElementById("ops");
  const doc = await (await fetch("/openapi.json")).json();
  document.getElementById("title").textContent = `${doc.info.title} ${doc.info.version}`;
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) {
      const box = el("section", "op");
      box.id = `${method}-${path}`;
      const head = el("h3");
      head.append(el("span", "method", method), el("span", "path", path));
      box.append(head, el("p", "", op.summary || ""));
      if (op.description) box.append(el("p", "", op.description));
      const schema = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
      if (schema) {
        const details = el("details");
        details.append(el("summary", "", "request body"), el("pre", "", JSON.stringify(schema.schema, null, 2)));
        box.append(details);
      }
      const codes = Object.entries(op.responses || {}).map(([code, r]) => `${code}: ${r.description}`);
      if (codes.length) box.append(el("p", "", "responses: " + codes.join("; ")));
      ops.append(box);
    }
  }
}
show();
