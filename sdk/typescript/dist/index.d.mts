/**
 * The ESM entry of the package `keel`: the CommonJS module's exports, by name, for
 * `import { connect } from "keel"` where the package is installed in `node_modules`.
 * (Under `keel run` the package is found through NODE_PATH, which ESM `import` ignores:
 * there, use `createRequire`; see the README.)
 */
export * from "./index.js";
