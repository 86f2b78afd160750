// structuredClone, as HTML's structured serialize/deserialize define it, in one pass: primitives, the
// wrapper objects, Date, RegExp, ArrayBuffer, typed arrays and DataView (sharing a cloned buffer as the
// originals share theirs), Map, Set, Error (and its standard subclasses), DOMException, arrays and plain
// objects (own enumerable properties), cycles and shared references kept. Anything else (a function, a symbol,
// a Promise, a WeakMap, one of the Web API classes such as Request or URL) is a DataCloneError DOMException, as
// in browsers, Deno and workerd. `transfer` detaches the listed ArrayBuffers. Evaluated once per runtime, after
// prelude.js and the other Web API files, whose classes it recognises.
(() => {
  "use strict";
  const DataCloneError = (message) => new DOMException(message, "DataCloneError");
  const describe = (value) => {
    try {
      return typeof value === "symbol" ? value.toString() : `${value}`;
    } catch {
      return Object.prototype.toString.call(value);
    }
  };
  const ERRORS = new Map(
    [Error, EvalError, RangeError, ReferenceError, SyntaxError, TypeError, URIError].map((E) => [E.name, E]),
  );
  const VIEWS = [Int8Array, Uint8Array, Uint8ClampedArray, Int16Array, Uint16Array, Int32Array, Uint32Array,
    Float32Array, Float64Array, BigInt64Array, BigUint64Array, DataView];
  if (typeof Float16Array === "function") VIEWS.push(Float16Array);
  // Objects with internal state a clone cannot carry.
  const UNCLONEABLE = [Promise, WeakMap, WeakSet, WeakRef, FinalizationRegistry, Symbol];
  if (typeof SharedArrayBuffer === "function") UNCLONEABLE.push(SharedArrayBuffer);
  // The Web API classes: platform objects that are not serializable.
  const PLATFORM = new Set();
  for (const name of ["Headers", "Request", "Response", "URL", "URLSearchParams", "TextEncoder", "TextDecoder",
    "Event", "EventTarget", "AbortController", "CryptoKey"]) {
    if (typeof globalThis[name] === "function") PLATFORM.add(globalThis[name].prototype);
  }
  const isPlatform = (value) => {
    for (let p = Object.getPrototypeOf(value); p !== null; p = Object.getPrototypeOf(p)) if (PLATFORM.has(p)) return true;
    return false;
  };
  const detached = (buffer) => buffer.detached === true;

  function structuredClone(value, options = undefined) {
    if (arguments.length < 1) {
      throw new TypeError("Failed to execute 'structuredClone': 1 argument required, but only 0 present");
    }
    if (options !== undefined && options !== null && typeof options !== "object" && typeof options !== "function") {
      throw new TypeError("Failed to execute 'structuredClone': the options are not an object");
    }
    const transfer = [];
    if (options?.transfer !== undefined) {
      for (const item of options.transfer) {
        if (item === null || (typeof item !== "object" && typeof item !== "function")) {
          throw new TypeError("Failed to execute 'structuredClone': a transferable is not an object");
        }
        transfer.push(item);
      }
    }
    for (const [i, item] of transfer.entries()) {
      if (!(item instanceof ArrayBuffer)) throw DataCloneError("Value not transferable");
      if (transfer.indexOf(item) !== i) throw DataCloneError("ArrayBuffer at index " + i + " is a duplicate of an earlier ArrayBuffer");
      if (detached(item)) throw DataCloneError("An ArrayBuffer is detached and could not be cloned.");
    }
    const memory = new Map();

    const cloneBuffer = (buffer) => {
      if (detached(buffer)) throw DataCloneError("An ArrayBuffer is detached and could not be cloned.");
      if (!buffer.resizable) return buffer.slice(0);
      const copy = new ArrayBuffer(buffer.byteLength, { maxByteLength: buffer.maxByteLength });
      new Uint8Array(copy).set(new Uint8Array(buffer));
      return copy;
    };

    const copyProperties = (from, to) => {
      for (const key of Object.keys(from)) to[key] = clone(from[key]);
      return to;
    };

    const clone = (v) => {
      if (typeof v === "symbol") throw DataCloneError(`${describe(v)} could not be cloned.`);
      if (typeof v === "function") throw DataCloneError(`${describe(v)} could not be cloned.`);
      if (v === null || typeof v !== "object") return v;
      const seen = memory.get(v);
      if (seen !== undefined) return seen;
      let out;
      if (Array.isArray(v)) {
        out = new Array(v.length);
        memory.set(v, out);
        return copyProperties(v, out);
      }
      if (v instanceof Boolean) out = Object(Boolean.prototype.valueOf.call(v));
      else if (v instanceof Number) out = Object(Number.prototype.valueOf.call(v));
      else if (v instanceof String) out = Object(String.prototype.valueOf.call(v));
      else if (v instanceof BigInt) out = Object(BigInt.prototype.valueOf.call(v));
      else if (v instanceof Date) out = new Date(Date.prototype.getTime.call(v));
      else if (v instanceof RegExp) out = new RegExp(v.source, v.flags);
      else if (v instanceof ArrayBuffer) out = cloneBuffer(v);
      else if (ArrayBuffer.isView(v)) {
        const View = VIEWS.find((C) => v instanceof C);
        if (View === undefined) throw DataCloneError(`${Object.prototype.toString.call(v)} could not be cloned.`);
        const buffer = clone(v.buffer);
        out = View === DataView
          ? new DataView(buffer, v.byteOffset, v.byteLength)
          : new View(buffer, v.byteOffset, v.length);
      } else if (v instanceof Map) {
        out = new Map();
        memory.set(v, out);
        for (const [key, value] of [...v]) out.set(clone(key), clone(value));
        return out;
      } else if (v instanceof Set) {
        out = new Set();
        memory.set(v, out);
        for (const item of [...v]) out.add(clone(item));
        return out;
      } else if (v instanceof DOMException) {
        out = new DOMException(v.message, v.name);
        if (typeof v.stack === "string") Object.defineProperty(out, "stack", { value: v.stack, writable: true, configurable: true });
      } else if (v instanceof Error) {
        const E = ERRORS.get(v.name) ?? Error;
        const message = Object.getOwnPropertyDescriptor(v, "message");
        out = message === undefined ? new E() : new E(`${v.message}`);
        Object.defineProperty(out, "stack", { value: `${v.stack}`, writable: true, configurable: true });
        memory.set(v, out);
        if (Object.hasOwn(v, "cause")) {
          Object.defineProperty(out, "cause", { value: clone(v.cause), writable: true, configurable: true });
        }
        return out;
      } else if (isPlatform(v)) {
        throw DataCloneError("Cannot clone object of unsupported type.");
      } else if (UNCLONEABLE.some((C) => v instanceof C)) {
        throw DataCloneError(`#<${v.constructor?.name ?? "Object"}> could not be cloned.`);
      } else {
        out = {};
        memory.set(v, out);
        return copyProperties(v, out);
      }
      memory.set(v, out);
      return out;
    };

    const result = clone(value);
    for (const buffer of transfer) buffer.transfer();
    return result;
  }
  Object.defineProperty(globalThis, "structuredClone", {
    value: structuredClone, writable: true, configurable: true, enumerable: false,
  });
})();
