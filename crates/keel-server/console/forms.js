// Forms generated from a JSON schema (the subset agents use for questions and `form`
// blocks): an object of string, number, integer, boolean, enum, nested object and array
// of scalars fields, with required fields. Validated here before sending; the server
// validates again and its 400 message is shown under the form.

import { h } from "./render.js";

/** The value of one scalar input, typed by its schema; throws a message when invalid. */
function scalar(schema, raw, name) {
  const type = schema.type;
  if (schema.enum) {
    const found = schema.enum.find((option) => String(option) === raw);
    if (found === undefined) throw `${name} must be one of ${schema.enum.join(", ")}`;
    return found;
  }
  if (type === "number" || type === "integer") {
    if (raw.trim() === "" || isNaN(Number(raw))) throw `${name} must be a number`;
    const n = Number(raw);
    if (type === "integer" && !Number.isInteger(n)) throw `${name} must be a whole number`;
    if (schema.minimum !== undefined && n < schema.minimum) throw `${name} must be at least ${schema.minimum}`;
    if (schema.maximum !== undefined && n > schema.maximum) throw `${name} must be at most ${schema.maximum}`;
    return n;
  }
  if (schema.minLength !== undefined && raw.length < schema.minLength) {
    throw `${name} must be at least ${schema.minLength} characters`;
  }
  if (schema.maxLength !== undefined && raw.length > schema.maxLength) {
    throw `${name} must be at most ${schema.maxLength} characters`;
  }
  if (schema.pattern !== undefined) {
    let re = null;
    try {
      re = new RegExp(schema.pattern, "u");
    } catch (_) {
      // A pattern this browser cannot read is left to the server.
    }
    if (re && !re.test(raw)) throw `${name} must match ${schema.pattern}`;
  }
  return raw;
}

/** One field: returns {el, read()} where read() gives the value (or undefined when
 * empty and optional) or throws a message. */
function field(name, schema, required, path) {
  schema = schema || {};
  const id = "f-" + path.join("-").replace(/[^A-Za-z0-9_-]/g, "_");
  const title = schema.title || name;
  const label = h("span", { class: "label" }, title, required ? h("span", { class: "req", title: "required" }, " *") : null);
  const help = schema.description ? h("span", { class: "muted small" }, schema.description) : null;
  const error = h("span", { class: "form-error", role: "alert" });
  const fail = (input, message) => {
    error.textContent = message;
    if (input) input.setAttribute("aria-invalid", "true");
    throw message;
  };
  const ok = (input) => {
    error.textContent = "";
    if (input) input.removeAttribute("aria-invalid");
  };

  if (schema.type === "object" && schema.properties) {
    const inner = objectFields(schema, path);
    const el = h("fieldset", { "data-field": name }, h("legend", {}, title), help, inner.el);
    return { el, read: () => inner.read() };
  }
  if (schema.type === "boolean") {
    const input = h("input", { type: "checkbox", id, name, checked: schema.default === true });
    const el = h("div", { class: "field", "data-field": name }, h("label", { class: "check", for: id }, input, title), help);
    return { el, read: () => input.checked };
  }
  if (schema.type === "array") {
    const items = schema.items || { type: "string" };
    const input = h("textarea", { id, name, rows: 3, placeholder: "one item per line" });
    if (Array.isArray(schema.default)) input.value = schema.default.join("\n");
    const el = h("div", { class: "field", "data-field": name }, h("label", { for: id }, label), input, help, error);
    return {
      el,
      read: () => {
        const lines = input.value.split("\n").map((line) => line.trim()).filter(Boolean);
        if (!lines.length && required) fail(input, `${title} is required`);
        try {
          const values = lines.map((line) => scalar(items, line, title));
          if (schema.minItems !== undefined && values.length < schema.minItems) {
            throw `${title} needs at least ${schema.minItems} items`;
          }
          if (schema.maxItems !== undefined && values.length > schema.maxItems) {
            throw `${title} takes at most ${schema.maxItems} items`;
          }
          ok(input);
          return lines.length || required ? values : undefined;
        } catch (message) {
          return fail(input, String(message));
        }
      },
    };
  }
  let input;
  if (schema.enum) {
    input = h(
      "select",
      { id, name },
      h("option", { value: "" }, required ? "choose…" : "(none)"),
      schema.enum.map((option) => h("option", { value: String(option) }, String(option))),
    );
    if (schema.default !== undefined) input.value = String(schema.default);
  } else if (schema.type === "number" || schema.type === "integer") {
    input = h("input", { id, name, type: "number", step: schema.type === "integer" ? "1" : "any" });
    if (schema.minimum !== undefined) input.min = schema.minimum;
    if (schema.maximum !== undefined) input.max = schema.maximum;
    if (schema.default !== undefined) input.value = schema.default;
  } else if ((schema.maxLength || 0) > 200 || schema.format === "textarea") {
    input = h("textarea", { id, name });
    if (schema.default !== undefined) input.value = schema.default;
  } else {
    input = h("input", { id, name, type: "text" });
    if (schema.default !== undefined) input.value = schema.default;
  }
  const el = h("div", { class: "field", "data-field": name }, h("label", { for: id }, label), input, help, error);
  return {
    el,
    read: () => {
      const raw = input.value;
      // An empty field is left out of the value (an optional text the person did not
      // fill in is absent, not ""); a required one is asked for.
      if (raw === "") {
        if (required) fail(input, `${title} is required`);
        ok(input);
        return undefined;
      }
      try {
        const value = scalar(schema, raw, title);
        ok(input);
        return value;
      } catch (message) {
        return fail(input, String(message));
      }
    },
  };
}

function objectFields(schema, path) {
  const required = new Set(schema.required || []);
  const fields = Object.entries(schema.properties || {}).map(([name, sub]) => [
    name,
    field(name, sub, required.has(name), path.concat(name)),
  ]);
  return {
    el: fields.map(([, f]) => f.el),
    read: () => {
      const value = {};
      const problems = [];
      for (const [name, f] of fields) {
        try {
          const v = f.read();
          if (v !== undefined) value[name] = v;
        } catch (message) {
          problems.push(String(message));
        }
      }
      if (problems.length) throw problems;
      return value;
    },
  };
}

/**
 * A form for `schema`. `onSubmit(value)` is awaited; a thrown error's message is shown
 * under the form (the server's 400 message, for one). Returns the `form` element.
 */
export function schemaForm(schema, { submitLabel = "Submit", onSubmit, name = "form" }) {
  const root = schema && schema.type === "object" ? schema : { type: "object", properties: { value: schema || {} }, required: ["value"] };
  const fields = objectFields(root, [name]);
  const status = h("div", { class: "form-error", role: "alert", "data-role": "form-status" });
  const button = h("button", { type: "submit" }, submitLabel);
  const form = h("form", { class: "schema-form", novalidate: true, "data-form": name }, fields.el, h("div", { class: "row" }, button), status);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    status.textContent = "";
    let value;
    try {
      value = fields.read();
    } catch (problems) {
      status.textContent = "Check the form: " + [].concat(problems).join("; ");
      return;
    }
    if (root !== schema) value = value.value;
    button.disabled = true;
    try {
      await onSubmit(value);
    } catch (err) {
      status.textContent = err.message || String(err);
    } finally {
      button.disabled = false;
    }
  });
  return form;
}
