// A safe subset of Markdown rendered to DOM nodes: headings, paragraphs, emphasis,
// inline code, fenced code, lists and links (http, https and mailto only). Everything
// else is text. Agent output is untrusted: no HTML is ever parsed.

import { h } from "./render.js";

const SAFE_LINK = /^(https?:|mailto:)/i;

/** Inline text: `code`, **strong**, *em* / _em_, [text](url). */
export function inline(text) {
  const out = [];
  const pattern = /(`[^`]+`)|(\*\*[^*]+\*\*)|(\*[^*\s][^*]*\*|_[^_\s][^_]*_)|(\[[^\]]+\]\([^)\s]+\))/;
  let rest = text;
  while (rest) {
    const match = pattern.exec(rest);
    if (!match) {
      out.push(rest);
      break;
    }
    if (match.index > 0) out.push(rest.slice(0, match.index));
    const token = match[0];
    if (match[1]) out.push(h("code", {}, token.slice(1, -1)));
    else if (match[2]) out.push(h("strong", {}, inline(token.slice(2, -2))));
    else if (match[3]) out.push(h("em", {}, inline(token.slice(1, -1))));
    else {
      const close = token.indexOf("](");
      const label = token.slice(1, close);
      const url = token.slice(close + 2, -1);
      out.push(
        SAFE_LINK.test(url)
          ? h("a", { href: url, target: "_blank", rel: "noopener noreferrer nofollow" }, inline(label))
          : `${label} (${url})`,
      );
    }
    rest = rest.slice(match.index + token.length);
  }
  return out;
}

/** A Markdown text as a `div.md` of block elements. */
export function markdown(text) {
  const root = h("div", { class: "md" });
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (/^```/.test(line)) {
      const body = [];
      i++;
      while (i < lines.length && !/^```/.test(lines[i])) body.push(lines[i++]);
      i++;
      root.append(h("pre", {}, h("code", {}, body.join("\n"))));
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      root.append(h(`h${Math.min(heading[1].length + 2, 6)}`, {}, inline(heading[2])));
      i++;
      continue;
    }
    if (/^\s*([-*+]|\d+[.)])\s+/.test(line)) {
      const ordered = /^\s*\d+[.)]/.test(line);
      const list = h(ordered ? "ol" : "ul", {});
      while (i < lines.length && /^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
        list.append(h("li", {}, inline(lines[i].replace(/^\s*([-*+]|\d+[.)])\s+/, ""))));
        i++;
      }
      root.append(list);
      continue;
    }
    if (!line.trim()) {
      i++;
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() && !/^(```|#{1,6}\s|\s*([-*+]|\d+[.)])\s+)/.test(lines[i])) {
      para.push(lines[i++]);
    }
    root.append(h("p", {}, inline(para.join(" "))));
  }
  return root;
}
