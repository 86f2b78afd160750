// The Web API subset a fetch handler uses, on top of QuickJS-ng: Headers, Request, Response, Blob, File, FormData,
// atob, btoa, console, queueMicrotask (URL, TextEncoder, crypto, DOMException and more: webapi.rs). Evaluated once
// per runtime, before the function's own code. `__portico_*` globals are how Portico hands requests in and takes
// responses out; `__portico_log` is native.
(() => {
  "use strict";
  // The classes native.rs makes, and what they are built on (taken out of the handler's reach).
  const classes = globalThis.__portico_classes;
  delete globalThis.__portico_classes;
  const TRUSTED = Symbol("trusted by Portico");
  const define = (name, value) =>
    Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });

  const utf8Encode = (text) => {
    text = String(text);
    const out = [];
    for (let i = 0; i < text.length; i++) {
      let c = text.codePointAt(i);
      if (c > 0xffff) i++;
      if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd; // a lone surrogate
      if (c < 0x80) out.push(c);
      else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
      else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
      else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    }
    return new Uint8Array(out);
  };

  const utf8Decode = (bytes) => {
    let out = "";
    for (let i = 0; i < bytes.length; ) {
      const b = bytes[i];
      let c = 0xfffd, n = 1;
      if (b < 0x80) c = b;
      else if (b >= 0xc2 && b < 0xe0 && i + 1 < bytes.length && (bytes[i + 1] & 0xc0) === 0x80) {
        c = ((b & 31) << 6) | (bytes[i + 1] & 63); n = 2;
      } else if (b >= 0xe0 && b < 0xf0 && i + 2 < bytes.length && (bytes[i + 1] & 0xc0) === 0x80 &&
        (bytes[i + 2] & 0xc0) === 0x80) {
        const v = ((b & 15) << 12) | ((bytes[i + 1] & 63) << 6) | (bytes[i + 2] & 63);
        if (v >= 0x800 && (v < 0xd800 || v > 0xdfff)) { c = v; n = 3; }
      } else if (b >= 0xf0 && b < 0xf5 && i + 3 < bytes.length && (bytes[i + 1] & 0xc0) === 0x80 &&
        (bytes[i + 2] & 0xc0) === 0x80 && (bytes[i + 3] & 0xc0) === 0x80) {
        const v = ((b & 7) << 18) | ((bytes[i + 1] & 63) << 12) | ((bytes[i + 2] & 63) << 6) | (bytes[i + 3] & 63);
        if (v >= 0x10000 && v <= 0x10ffff) { c = v; n = 4; }
      }
      out += String.fromCodePoint(c);
      i += n;
    }
    return out;
  };

  // Native when the text is well-formed (QuickJS hands Rust its strings as UTF-8), which is nearly always.
  const jsUtf8Encode = utf8Encode;
  const fastEncode = (text) => {
    try { return new Uint8Array(__portico_utf8_encode(String(text))); } catch { return jsUtf8Encode(text); }
  };
  const fastDecode = (bytes) => __portico_utf8_decode(bytes.buffer, bytes.byteOffset, bytes.byteLength);

  // JSON.parse: serde_json's fast path (json.rs) for a string of up to 1 MiB without a reviver, QuickJS's own
  // parser for the rest and for whatever the fast path leaves to it (errors included). (Longer texts stay with
  // QuickJS, whose parser the CPU limit can interrupt.)
  const quickJsParse = JSON.parse;
  const nativeParse = __portico_json_parse;
  const parseJson = { parse(text, reviver) {
    if (reviver === undefined && typeof text === "string" && text.length <= 1048576) {
      const value = nativeParse(text);
      if (value !== undefined) return value;
    }
    return quickJsParse(text, reviver);
  } }.parse;
  Object.defineProperty(JSON, "parse", { value: parseJson, writable: true, configurable: true, enumerable: false });
  // JSON.stringify: a native fast path (json.rs) without a replacer or an indent, for the values it takes.
  const quickJsStringify = JSON.stringify;
  const nativeStringify = __portico_json_stringify;
  const stringifyJson = { stringify(value, replacer, space) {
    if (replacer === undefined && space === undefined) {
      const text = nativeStringify(value);
      if (text !== undefined) return text;
    }
    return quickJsStringify(value, replacer, space);
  } }.stringify;
  Object.defineProperty(JSON, "stringify", { value: stringifyJson, writable: true, configurable: true, enumerable: false });

  const toBytes = (body) => {
    if (body === null || body === undefined) return new Uint8Array(0);
    if (typeof body === "string") return fastEncode(body);
    if (body instanceof ArrayBuffer) return new Uint8Array(body);
    if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
    if (body instanceof URLSearchParams) return fastEncode(body.toString());
    return fastEncode(String(body));
  };

  // Names seen before are looked up, not checked again: the same few names come with every request.
  // (Regular expressions are made once: a literal in a function makes a new object at each call.)
  const knownNames = new Map();
  const TOKEN = /^[!#$%&'*+\-.^_`|~0-9a-z]+$/;
  const normalizeName = (name) => {
    name = String(name);
    const known = knownNames.get(name);
    if (known !== undefined) return known;
    const lower = name.toLowerCase();
    if (!TOKEN.test(lower)) throw new TypeError(`invalid header name ${JSON.stringify(name)}`);
    if (knownNames.size < 512) knownNames.set(name, lower);
    return lower;
  };
  // A value loses its leading and trailing HTTP whitespace; one with a NUL, CR or LF left, or a character past
  // U+00FF (no ByteString), is refused.
  const BAD_VALUE = /[\0\n\r\u0100-\uffff]/;
  const HTTP_WHITESPACE = /^[\t\n\r ]+|[\t\n\r ]+$/g;
  const trimValue = (value) => {
    const first = value.charCodeAt(0), last = value.charCodeAt(value.length - 1);
    return first > 32 && last > 32 ? value : value.replace(HTTP_WHITESPACE, "");
  };
  const normalizeValue = (value) => {
    value = trimValue(String(value));
    if (BAD_VALUE.test(value)) throw new TypeError(`invalid header value ${JSON.stringify(value)}`);
    return value;
  };
  // WebIDL's ByteString: a string of characters up to U+00FF (a symbol cannot be one: String() throws).
  const PAST_LATIN1 = /[\u0100-\uffff]/;
  const byteString = (value) => {
    if (typeof value === "symbol") throw new TypeError("a symbol is not a ByteString");
    value = String(value);
    if (PAST_LATIN1.test(value)) throw new TypeError(`${JSON.stringify(value)} has a character past U+00FF`);
    return value;
  };
  // A name of a Headers' init as a ByteString: a name seen before is one.
  const byteName = (name) => (typeof name === "string" && knownNames.has(name) ? name : byteString(name));
  // A value of a Headers' init as a ByteString, and whether it is a valid value once trimmed (`clean`, set
  // here: most values are, and need no second look).
  let clean = false;
  const byteValue = (value) => {
    if (typeof value === "symbol") throw new TypeError("a symbol is not a ByteString");
    value = String(value);
    clean = !BAD_VALUE.test(value);
    if (!clean && PAST_LATIN1.test(value)) throw new TypeError(`${JSON.stringify(value)} has a character past U+00FF`);
    return value;
  };

  const isEnumerable = Object.prototype.propertyIsEnumerable;
  // A list Portico made (names lowercase, values trimmed) handed to `new Headers(TRUSTED_LIST)`.
  const TRUSTED_LIST = Object.freeze({});
  let trustedList = null;
  // Changes to any Headers, counted: an iterator sorts its headers again only when this has moved.
  let headersChanged = 0;
  // The pairs to iterate over, as the Fetch standard has them: sorted by name, the values of a repeated name
  // joined with ", " (but each set-cookie apart).
  const sortAndCombine = (list) => {
    const at = [];
    for (let i = 0; i < list.length; i += 2) at.push(i);
    at.sort((a, b) => (list[a] < list[b] ? -1 : list[a] > list[b] ? 1 : a - b));
    const out = [];
    let last = null;
    for (const i of at) {
      const name = list[i];
      if (last !== null && last[0] === name && name !== "set-cookie") last[1] += ", " + list[i + 1];
      else out.push(last = [name, list[i + 1]]);
    }
    return out;
  };
  let listOf, headersEntries;
  // A Headers iterator: it walks the sorted pairs by index, looking at them anew after a change, so that what
  // is added or removed meanwhile is seen as the standard says. [headers, kind, index, pairs, changes seen]
  class HeadersIterator {
    #s;
    constructor(headers, kind) { this.#s = [headers, kind, 0, null, -1]; }
    next() {
      const s = this.#s;
      if (s[4] !== headersChanged) {
        s[3] = sortAndCombine(listOf(s[0]));
        s[4] = headersChanged;
      }
      const pair = s[3][s[2]];
      if (pair === undefined) return { value: undefined, done: true };
      s[2]++;
      return { value: s[1] === 0 ? [pair[0], pair[1]] : s[1] === 1 ? pair[0] : pair[1], done: false };
    }
  }
  {
    const proto = HeadersIterator.prototype;
    Object.setPrototypeOf(proto, Object.getPrototypeOf(Object.getPrototypeOf([][Symbol.iterator]())));
    delete proto.constructor;
    Object.defineProperty(proto, "next", { enumerable: true });
    Object.defineProperty(proto, Symbol.toStringTag, { value: "Headers Iterator", configurable: true });
  }

  // Kept as one flat list, name, value, name, value...: a request's headers are read far more often than
  // changed, and a flat list costs one array. A frozen list is an immutable Headers (Response.error()'s): any
  // change throws a TypeError.
  class Headers {
    #list = [];
    constructor(init) {
      if (init === undefined) return;
      if (init === TRUSTED_LIST) {
        this.#list = trustedList;
        trustedList = null;
        return;
      }
      if (init === null || (typeof init !== "object" && typeof init !== "function")) {
        throw new TypeError("Headers: the init is neither a sequence of pairs nor a record");
      }
      // As WebIDL reads a (sequence or record): @@iterator first, then either the pairs it gives or the
      // object's own enumerable properties.
      const method = init[Symbol.iterator];
      if (method === headersEntries && #list in init) {
        this.#list = init.#list.slice();
        return;
      }
      // The pairs as ByteStrings first (name, value, clean, ...), then appended.
      const pairs = [];
      if (method !== undefined && method !== null) {
        if (typeof method !== "function") throw new TypeError("Headers: the init's @@iterator is not a function");
        for (const pair of { [Symbol.iterator]: () => method.call(init) }) {
          if (pair === null || (typeof pair !== "object" && typeof pair !== "function")) {
            throw new TypeError("Headers: a header pair is not a sequence");
          }
          const items = Array.isArray(pair) ? pair : [...pair];
          if (items.length !== 2) throw new TypeError("Headers: a header pair has two items");
          pairs.push(byteName(items[0]), byteValue(items[1]), clean);
        }
      } else {
        // (byteName and byteValue inlined for the common case: a name seen before, a string value.)
        const keys = Reflect.ownKeys(init);
        for (let i = 0; i < keys.length; i++) {
          const key = keys[i];
          if (!isEnumerable.call(init, key)) continue;
          const name = typeof key === "string" && knownNames.has(key) ? key : byteString(key);
          const value = init[key];
          if (typeof value === "string" && !BAD_VALUE.test(value)) pairs.push(name, value, true);
          else pairs.push(name, byteValue(value), clean);
        }
      }
      const list = this.#list;
      for (let i = 0; i < pairs.length; i += 3) {
        list.push(normalizeName(pairs[i]), pairs[i + 2] ? trimValue(pairs[i + 1]) : normalizeValue(pairs[i + 1]));
      }
    }
    append(name, value) {
      this.#list.push(normalizeName(name), normalizeValue(value));
      headersChanged++;
    }
    set(name, value) {
      name = normalizeName(name);
      value = normalizeValue(value);
      const list = this.#list;
      if (Object.isFrozen(list)) throw new TypeError("these headers cannot be changed");
      let found = false;
      for (let i = 0; i < list.length; ) {
        if (list[i] !== name) { i += 2; continue; }
        if (!found) { list[i + 1] = value; found = true; i += 2; } else list.splice(i, 2);
      }
      if (!found) list.push(name, value);
      headersChanged++;
    }
    get(name) {
      name = normalizeName(name);
      const list = this.#list;
      let out = null;
      for (let i = 0; i < list.length; i += 2) {
        if (list[i] === name) out = out === null ? list[i + 1] : out + ", " + list[i + 1];
      }
      return out;
    }
    getSetCookie() {
      const out = [];
      for (let i = 0; i < this.#list.length; i += 2) if (this.#list[i] === "set-cookie") out.push(this.#list[i + 1]);
      return out;
    }
    has(name) {
      name = normalizeName(name);
      for (let i = 0; i < this.#list.length; i += 2) if (this.#list[i] === name) return true;
      return false;
    }
    delete(name) {
      name = normalizeName(name);
      const list = this.#list;
      if (Object.isFrozen(list)) throw new TypeError("these headers cannot be changed");
      for (let i = 0; i < list.length; ) {
        if (list[i] === name) list.splice(i, 2);
        else i += 2;
      }
      headersChanged++;
    }
    entries() { return new HeadersIterator(this, 0); }
    keys() { return new HeadersIterator(this, 1); }
    values() { return new HeadersIterator(this, 2); }
    forEach(callback, thisArg = undefined) {
      if (typeof callback !== "function") throw new TypeError("Headers.forEach: the callback is not a function");
      let pairs = null, seen = -1;
      for (let i = 0; ; i++) {
        if (seen !== headersChanged) {
          pairs = sortAndCombine(this.#list);
          seen = headersChanged;
        }
        if (i >= pairs.length) return;
        callback.call(thisArg, pairs[i][1], pairs[i][0], this);
      }
    }
    get [Symbol.toStringTag]() { return "Headers"; }
    // The list itself, name, value, ...: for Portico, and for copying.
    __flat() { return this.#list; }
    static {
      listOf = (headers) => headers.#list;
      headersEntries = this.prototype.entries;
      Object.defineProperty(this.prototype, Symbol.iterator, {
        value: this.prototype.entries, writable: true, configurable: true, enumerable: false,
      });
    }
  }
  const immutable = (headers) => {
    Object.freeze(listOf(headers));
    return headers;
  };

  // A body is kept as it was given (a string stays a string) and turned into bytes only when asked.
  // Streams: the WHATWG Streams API of web-streams-polyfill (vendor/, MIT), evaluated the first time a handler
  // touches one of these names: 65 KB of JavaScript that handlers which never use a stream do not compile.
  const STREAM_NAMES = ["ReadableStream", "ReadableStreamDefaultReader", "ReadableStreamBYOBReader",
    "ReadableStreamDefaultController", "ReadableByteStreamController", "ReadableStreamBYOBRequest", "WritableStream",
    "WritableStreamDefaultWriter", "WritableStreamDefaultController", "TransformStream",
    "TransformStreamDefaultController", "ByteLengthQueuingStrategy", "CountQueuingStrategy"];
  let streamsLoaded = false;
  const loadStreams = () => {
    if (streamsLoaded) return;
    streamsLoaded = true;
    for (const name of STREAM_NAMES) delete globalThis[name];
    __portico_load_streams();
  };
  for (const name of STREAM_NAMES) {
    Object.defineProperty(globalThis, name, {
      configurable: true, enumerable: false,
      get() { loadStreams(); return globalThis[name]; },
      set(value) { loadStreams(); globalThis[name] = value; },
    });
  }
  const isStream = (x) => streamsLoaded && x instanceof globalThis.ReadableStream;

  // The request body Portico has not read yet: pulled from the client a piece at a time as the handler reads.
  class NativeBody {}
  const bodyPulls = new Map();
  const pullNative = () => new Promise((resolve, reject) => {
    const id = nextOperation++;
    if (!__portico_body_pull(id)) throw new TypeError("the request body can only be read while its request is handled");
    bodyPulls.set(id, { resolve, reject });
  });
  define("__portico_body_chunk", (id, chunk, error) => {
    const pull = bodyPulls.get(id);
    if (!pull) return;
    bodyPulls.delete(id);
    if (error !== undefined) pull.reject(new TypeError(error));
    else pull.resolve(chunk === null ? null : new Uint8Array(chunk));
  });
  const nativeStream = () => new globalThis.ReadableStream({
    async pull(controller) {
      const chunk = await pullNative();
      if (chunk === null) controller.close();
      else controller.enqueue(chunk);
    },
  }, { highWaterMark: 0 });
  const concat = (chunks, length) => {
    const out = new Uint8Array(length);
    let at = 0;
    for (const c of chunks) { out.set(c, at); at += c.byteLength; }
    return out;
  };
  // Blob, File and FormData, made the first time a handler touches one of these names (or reads a body as one):
  // a runtime that never does keeps neither their objects nor the heap they would take. `forms` is null until
  // then, and then holds what the bodies use.
  let forms = null;
  const loadForms = () => {
    if (forms !== null) return forms;
    // The File API's Blob: bytes in memory (copied in, never handed out) and a type.
    const BLOB_TYPE = /^[\x20-\x7e]*$/;
    let blobBytes;
    class Blob {
      // [bytes, type]
      #s;
      constructor(parts = undefined, options = undefined) {
        let endings = "transparent", type = "";
        if (options !== undefined && options !== null) {
          if (typeof options !== "object" && typeof options !== "function") {
            throw new TypeError("Blob: the options are not an object");
          }
          if (options.endings !== undefined) {
            endings = String(options.endings);
            if (endings !== "transparent" && endings !== "native") {
              throw new TypeError(`Blob: ${JSON.stringify(endings)} is not an endings value`);
            }
          }
          if (options.type !== undefined) type = String(options.type);
        }
        type = BLOB_TYPE.test(type) ? type.toLowerCase() : "";
        const chunks = [];
        let length = 0;
        if (parts !== undefined) {
          const iterable = parts !== null && (typeof parts === "object" || typeof parts === "function");
          if (!iterable || typeof parts[Symbol.iterator] !== "function") {
            throw new TypeError("Blob: the parts are not a sequence");
          }
          for (const part of parts) {
            let bytes;
            if (part instanceof Blob) bytes = part.#s[0];
            else if (part instanceof ArrayBuffer) bytes = new Uint8Array(part.slice(0));
            else if (ArrayBuffer.isView(part)) bytes = new Uint8Array(bufferOf(part));
            else {
              let text = String(part); // (a symbol throws a TypeError)
              if (endings === "native") text = text.replace(/\r\n?/g, "\n");
              bytes = fastEncode(text);
            }
            chunks.push(bytes);
            length += bytes.byteLength;
          }
        }
        this.#s = [concat(chunks, length), type];
      }
      get size() { return this.#s[0].byteLength; }
      get type() { return this.#s[1]; }
      slice(start = undefined, end = undefined, contentType = undefined) {
        const bytes = this.#s[0], size = bytes.byteLength;
        // (WebIDL's [Clamp] long long: rounded half to even.)
        const at = (given, fallback) => {
          if (given === undefined) return fallback;
          let n = Number(given);
          if (Number.isNaN(n)) n = 0;
          const floor = Math.floor(n), rest = n - floor;
          n = rest < 0.5 ? floor : rest > 0.5 ? floor + 1 : floor % 2 === 0 ? floor : floor + 1;
          return n < 0 ? Math.max(size + n, 0) : Math.min(n, size);
        };
        const from = at(start, 0), to = Math.max(at(end, size), from);
        const blob = new Blob([], { type: contentType === undefined ? "" : String(contentType) });
        blob.#s[0] = bytes.slice(from, to);
        return blob;
      }
      text() { return Promise.resolve(decodeBody(this.#s[0])); }
      arrayBuffer() { return Promise.resolve(bufferOf(this.#s[0])); }
      bytes() { return Promise.resolve(this.#s[0].slice()); }
      stream() { return byteStream(this.#s[0]); }
      get [Symbol.toStringTag]() { return "Blob"; }
      static { blobBytes = (blob) => blob.#s[0]; }
    }
    class File extends Blob {
      // [name, lastModified]
      #f;
      constructor(bits, name, options = undefined) {
        if (arguments.length < 2) throw new TypeError("File: a name is needed");
        super(bits, options);
        const lastModified = options !== undefined && options !== null && options.lastModified !== undefined
          ? Math.trunc(Number(options.lastModified)) || 0 : Date.now();
        this.#f = [String(name), lastModified];
      }
      get name() { return this.#f[0]; }
      get lastModified() { return this.#f[1]; }
      get [Symbol.toStringTag]() { return "File"; }
    }

    // The XMLHttpRequest Standard's FormData, without HTML forms: entries of a name and a string or a File, in
    // order. As a body it is multipart/form-data, with a boundary made once per FormData.
    let formState;
    class FormData {
      // [entries ([name, value] each), boundary (made when first needed)]
      #s = [[], null];
      constructor(form = undefined, submitter = undefined) {
        if (form !== undefined) throw new TypeError("FormData: there are no HTML forms here");
      }
      append(name, value, filename = undefined) { this.#s[0].push(formEntry(name, value, filename, arguments.length)); }
      delete(name) {
        name = String(name).toWellFormed();
        this.#s[0] = this.#s[0].filter((e) => e[0] !== name);
      }
      get(name) {
        name = String(name).toWellFormed();
        const entry = this.#s[0].find((e) => e[0] === name);
        return entry === undefined ? null : entry[1];
      }
      getAll(name) {
        name = String(name).toWellFormed();
        return this.#s[0].filter((e) => e[0] === name).map((e) => e[1]);
      }
      has(name) {
        name = String(name).toWellFormed();
        return this.#s[0].some((e) => e[0] === name);
      }
      set(name, value, filename = undefined) {
        const entry = formEntry(name, value, filename, arguments.length);
        const entries = this.#s[0], at = entries.findIndex((e) => e[0] === entry[0]);
        if (at < 0) entries.push(entry);
        else this.#s[0] = [...entries.slice(0, at), entry, ...entries.slice(at + 1).filter((e) => e[0] !== entry[0])];
      }
      entries() { return new FormDataIterator(this, 0); }
      keys() { return new FormDataIterator(this, 1); }
      values() { return new FormDataIterator(this, 2); }
      forEach(callback, thisArg = undefined) {
        if (typeof callback !== "function") throw new TypeError("FormData.forEach: the callback is not a function");
        for (let i = 0; i < this.#s[0].length; i++) callback.call(thisArg, this.#s[0][i][1], this.#s[0][i][0], this);
      }
      get [Symbol.toStringTag]() { return "FormData"; }
      static {
        formState = (form) => form.#s;
        Object.defineProperty(this.prototype, Symbol.iterator, {
          value: this.prototype.entries, writable: true, configurable: true, enumerable: false,
        });
      }
    }
    const formEntry = (name, value, filename, count) => {
      name = String(name).toWellFormed();
      if (!(value instanceof Blob)) {
        if (count > 2) throw new TypeError("FormData: a file name goes with a Blob only");
        return [name, String(value).toWellFormed()];
      }
      if (value instanceof File && filename === undefined) return [name, value];
      const options = { type: value.type, lastModified: value instanceof File ? value.lastModified : undefined };
      return [name, new File([value], filename === undefined ? "blob" : String(filename), options)];
    };
    class FormDataIterator {
      // [form, kind, index]
      #s;
      constructor(form, kind) { this.#s = [form, kind, 0]; }
      next() {
        const s = this.#s, entry = formState(s[0])[0][s[2]];
        if (entry === undefined) return { value: undefined, done: true };
        s[2]++;
        return { value: s[1] === 0 ? [entry[0], entry[1]] : s[1] === 1 ? entry[0] : entry[1], done: false };
      }
    }
    {
      const proto = FormDataIterator.prototype;
      Object.setPrototypeOf(proto, Object.getPrototypeOf(Object.getPrototypeOf([][Symbol.iterator]())));
      delete proto.constructor;
      Object.defineProperty(proto, "next", { enumerable: true });
      Object.defineProperty(proto, Symbol.toStringTag, { value: "FormData Iterator", configurable: true });
    }
    const formBoundary = (form) => {
      const s = formState(form);
      if (s[1] === null) {
        let random = "";
        for (let i = 0; i < 24; i++) random += Math.floor(Math.random() * 16).toString(16);
        s[1] = "----PorticoFormBoundary" + random;
      }
      return s[1];
    };
    // multipart/form-data (RFC 7578, as the HTML Standard writes it): names and file names with CR, LF and `"`
    // escaped, string values with their line breaks made CRLF.
    const escapeFormName = (name) =>
      name.replace(/\r\n?|\n/g, "\r\n").replace(/\n/g, "%0A").replace(/\r/g, "%0D").replace(/"/g, "%22");
    const serializeForm = (form) => {
      const boundary = formBoundary(form), chunks = [];
      let length = 0;
      const add = (bytes) => { chunks.push(bytes); length += bytes.byteLength; };
      for (const [name, value] of formState(form)[0]) {
        let head = `--${boundary}\r\nContent-Disposition: form-data; name="${escapeFormName(name)}"`;
        if (typeof value === "string") {
          add(fastEncode(`${head}\r\n\r\n${value.replace(/\r\n?|\n/g, "\r\n")}\r\n`));
        } else {
          const type = value.type || "application/octet-stream";
          head += `; filename="${escapeFormName(value.name)}"\r\nContent-Type: ${type}\r\n\r\n`;
          add(fastEncode(head));
          add(blobBytes(value));
          add(fastEncode("\r\n"));
        }
      }
      add(fastEncode(`--${boundary}--\r\n`));
      return concat(chunks, length);
    };
    // The reverse, for formData(): a TypeError for what does not parse.
    const formParameter = (header, key) => {
      const match = new RegExp(`;\\s*${key}\\s*=\\s*(?:"((?:[^"\\\\]|\\\\.)*)"|([^;\\s]*))`, "i").exec(header);
      return match === null ? null : match[1] !== undefined ? match[1].replace(/\\(.)/g, "$1") : match[2];
    };
    const latin1 = (bytes) => {
      let out = "";
      for (let i = 0; i < bytes.length; i += 8192) out += String.fromCharCode.apply(null, bytes.subarray(i, i + 8192));
      return out;
    };
    const fromLatin1 = (text) => fastDecode(Uint8Array.from(text, (c) => c.charCodeAt(0)));
    const parseMultipart = (bytes, boundary) => {
      const bad = () => new TypeError("formData(): the body is not multipart/form-data of its boundary");
      const text = latin1(bytes), delimiter = "--" + boundary;
      let at = text.indexOf(delimiter);
      if (at < 0) throw bad();
      const form = new FormData();
      for (;;) {
        at += delimiter.length;
        if (text.startsWith("--", at)) return form;
        if (!text.startsWith("\r\n", at)) throw bad();
        at += 2;
        const headEnd = text.indexOf("\r\n\r\n", at);
        if (headEnd < 0) throw bad();
        let name = null, filename = null, type = "text/plain";
        for (const line of text.slice(at, headEnd).split("\r\n")) {
          const colon = line.indexOf(":");
          if (colon < 0) throw bad();
          const key = line.slice(0, colon).trim().toLowerCase(), value = line.slice(colon + 1).trim();
          if (key === "content-disposition") {
            if (!/^form-data\s*(;|$)/i.test(value)) throw bad();
            name = formParameter(value, "name");
            filename = formParameter(value, "filename");
          } else if (key === "content-type") type = value;
        }
        if (name === null) throw bad();
        const end = text.indexOf("\r\n" + delimiter, headEnd + 4);
        if (end < 0) throw bad();
        const content = bytes.subarray(headEnd + 4, end);
        if (filename === null) form.append(fromLatin1(name), fastDecode(content));
        else form.append(fromLatin1(name), new File([content], fromLatin1(filename), { type }));
        at = end + 2;
      }
    };
    const parseForm = (bytes, contentType) => {
      const type = mimeTypeOf(contentType);
      const essence = type.split(";")[0];
      if (essence === "multipart/form-data") {
        const boundary = formParameter(contentType, "boundary");
        if (boundary === null || boundary === "") throw new TypeError("formData(): a multipart body without a boundary");
        return parseMultipart(bytes, boundary);
      }
      if (essence === "application/x-www-form-urlencoded") {
        const form = new FormData();
        for (const [name, value] of new URLSearchParams(decodeBody(bytes))) form.append(name, value);
        return form;
      }
      throw new TypeError(`formData(): the body's type is ${JSON.stringify(contentType ?? "")}, not a form's`);
    };

    forms = { Blob, File, FormData, blobBytes, formBoundary, serializeForm, parseForm };
    for (const name of FORM_NAMES) {
      delete globalThis[name];
      define(name, forms[name]);
    }
    return forms;
  };
  const FORM_NAMES = ["Blob", "File", "FormData"];
  for (const name of FORM_NAMES) {
    Object.defineProperty(globalThis, name, {
      configurable: true, enumerable: false,
      get() { loadForms(); return globalThis[name]; },
      set(value) { loadForms(); globalThis[name] = value; },
    });
  }

  // A byte stream of one chunk (a copy: a byte stream takes its chunks' buffers).
  const byteStream = (bytes) => new globalThis.ReadableStream({
    type: "bytes",
    start(controller) {
      if (bytes.byteLength > 0) controller.enqueue(bytes.slice());
      controller.close();
    },
  });

  const readAll = async (source) => {
    const chunks = [];
    let length = 0;
    if (source instanceof NativeBody) {
      const limit = __portico_request_limit();
      for (let c = await pullNative(); c !== null; c = await pullNative()) {
        chunks.push(c);
        length += c.byteLength;
        if (length > limit) {
          __portico_request_too_large();
          throw new RangeError(`the request body is larger than the function's max_request (${limit} bytes)`);
        }
      }
    } else {
      const reader = source.getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        if (!(value instanceof Uint8Array)) {
          const error = new TypeError("a body's stream gave a chunk that is not a Uint8Array");
          reader.cancel(error).catch(() => {});
          throw error;
        }
        chunks.push(value);
        length += value.byteLength;
      }
    }
    return concat(chunks, length);
  };

  // A Request or a Response keeps its state in one array in one private field, and neither inherits from a
  // Body class: QuickJS pays for every constructor in a chain and for every field an object gains (about a
  // thousand instructions each), so one constructor and one field make a request or a response cheaper.
  // The body's part of the state, first in both: [source, bytes, used, ...]. A body is kept as it was given
  // (a string stays a string, a stream a stream), its bytes made when asked.
  const NO_INIT = Object.freeze({});
  const TEXT_TYPE = "text/plain;charset=UTF-8";
  const FORM_TYPE = "application/x-www-form-urlencoded;charset=UTF-8";
  const JSON_TYPE = "application/json";
  // A Content-Type as a Blob's type: its MIME type with the essence lowercased, "" for none or no MIME type.
  const MIME_ESSENCE = /^[!#$%&'*+\-.^_`|~0-9a-z]+\/[!#$%&'*+\-.^_`|~0-9a-z]+$/;
  const mimeTypeOf = (value) => {
    if (value === null) return "";
    const parts = value.split(";");
    const essence = parts[0].trim().toLowerCase();
    if (!MIME_ESSENCE.test(essence)) return "";
    return [essence, ...parts.slice(1).map((p) => p.trim()).filter((p) => p !== "")].join(";");
  };
  // A stream already read from or locked cannot become a body (the polyfill's own marks: `locked` and the
  // standard's [[disturbed]], read without a getter's call).
  const disturbed = (stream) => stream._disturbed === true;
  // The Fetch standard's "extract a body": a string, bytes, a stream, a Blob, a FormData, or anything else as
  // its string (a URLSearchParams' included). `bodyType` is then the content-type it gives when the headers
  // have none (null for none).
  let bodyType = null;
  const sourceOf = (body) => {
    if (typeof body === "string") {
      bodyType = TEXT_TYPE;
      return body;
    }
    bodyType = null;
    if (body === null || body === undefined || body instanceof NativeBody) return body ?? null;
    if (isStream(body)) {
      if (body._reader !== undefined || body._disturbed === true) {
        throw new TypeError("a stream that is locked or was read cannot be a body");
      }
      return body;
    }
    if (body instanceof ArrayBuffer || ArrayBuffer.isView(body)) return toBytes(body);
    if (forms !== null && body instanceof forms.Blob) {
      bodyType = body.type === "" ? null : body.type;
      return forms.blobBytes(body);
    }
    if (forms !== null && body instanceof forms.FormData) {
      bodyType = `multipart/form-data; boundary=${forms.formBoundary(body)}`;
      return forms.serializeForm(body);
    }
    bodyType = body instanceof URLSearchParams ? FORM_TYPE : TEXT_TYPE;
    return String(body);
  };
  const inHand = (source) => !(source instanceof NativeBody) && !isStream(source);
  // `bodyUsed`: the body was read (or its stream was).
  const bodyUsed = (s) => s[0] !== null && (s[2] || (isStream(s[0]) && disturbed(s[0])));
  // A body that cannot be read again: used, or its stream locked.
  const unusable = (s) => s[0] !== null && (s[2] || (isStream(s[0]) && (s[0].locked || disturbed(s[0]))));
  const useBody = (s) => {
    if (unusable(s)) throw new TypeError("body already used");
    if (s[0] !== null) s[2] = true;
  };
  // The bytes of a body in hand (`null` for none or for a stream, whose bytes are not in hand).
  const bytesOf = (s) => {
    if (s[1] === undefined) {
      const source = s[0];
      s[1] = typeof source === "string" ? toBytes(source) : inHand(source) ? source : null;
    }
    return s[1];
  };
  const wholeBody = (s) => (inHand(s[0]) ? Promise.resolve(bytesOf(s) || new Uint8Array(0)) : readAll(s[0]));
  const streamOf = (s) => {
    const source = s[0];
    if (source === null || isStream(source)) return source;
    const stream = source instanceof NativeBody ? nativeStream() : byteStream(toBytes(source));
    // A body read already (as text, say) has a stream that was read: locked for good.
    if (s[2]) stream.getReader();
    s[0] = stream;
    return stream;
  };
  // The body to give a new Request or Response made from this one: a stream is handed over (this one is used
  // from then on), bytes are shared.
  // (A stream the handler has is piped into a new one: the new body is not the old one's object.)
  const handOver = (s) => {
    useBody(s);
    const source = s[0];
    if (inHand(source)) return bytesOf(s);
    return isStream(source) ? source.pipeThrough(new globalThis.TransformStream()) : source;
  };
  // A stream teed as clone() does: the second branch gets a structured clone of each chunk, so that neither
  // side sees what the other does to its chunks.
  const cloningTee = (stream) => {
    const reader = stream.getReader();
    let reading = false, again = false, canceled1 = false, canceled2 = false, reason1, reason2, c1, c2;
    let settleCancel;
    const canceled = new Promise((resolve) => { settleCancel = resolve; });
    const each = (f) => { try { f(); } catch {} };
    const pull = () => {
      if (reading) {
        again = true;
        return Promise.resolve();
      }
      reading = true;
      reader.read().then(({ done, value }) => {
        reading = false;
        if (done) {
          if (!canceled1) each(() => c1.close());
          if (!canceled2) each(() => c2.close());
          settleCancel();
          return;
        }
        let copy = value;
        if (!canceled2) {
          try {
            copy = structuredClone(value);
          } catch (e) {
            each(() => c1.error(e));
            each(() => c2.error(e));
            settleCancel(reader.cancel(e));
            return;
          }
        }
        if (!canceled1) each(() => c1.enqueue(value));
        if (!canceled2) each(() => c2.enqueue(copy));
        if (again) {
          again = false;
          pull();
        }
      }, (e) => {
        each(() => c1.error(e));
        each(() => c2.error(e));
        settleCancel();
      });
      return Promise.resolve();
    };
    const RS = globalThis.ReadableStream;
    const branch1 = new RS({ start(c) { c1 = c; }, pull, cancel(reason) {
      canceled1 = true;
      reason1 = reason;
      if (canceled2) settleCancel(reader.cancel([reason1, reason2]));
      return canceled;
    } });
    const branch2 = new RS({ start(c) { c2 = c; }, pull, cancel(reason) {
      canceled2 = true;
      reason2 = reason;
      if (canceled1) settleCancel(reader.cancel([reason1, reason2]));
      return canceled;
    } });
    return [branch1, branch2];
  };
  // For clone(): a streamed body split in two, one branch kept, the other returned.
  const tee = (s) => {
    if (unusable(s)) throw new TypeError("body already used");
    if (inHand(s[0])) return bytesOf(s);
    const [mine, theirs] = cloningTee(streamOf(s));
    s[0] = mine;
    return theirs;
  };
  const bufferOf = (b) => b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
  // UTF-8 decode, as the standard's: a leading BOM is dropped.
  const decodeBody = (b) => fastDecode(b[0] === 0xef && b[1] === 0xbb && b[2] === 0xbf ? b.subarray(3) : b);
  // The Body mixin's members, on Request.prototype and Response.prototype; `stateOf` checks the brand. The
  // read methods answer at once for a body in hand (no async function's machinery).
  const installBody = (proto, stateOf) => {
    const text = function text() {
      try {
        const s = stateOf(this);
        useBody(s);
        const source = s[0];
        if (typeof source === "string") {
          // (What its UTF-8 bytes decode to: lone surrogates become U+FFFD, a BOM goes.)
          return Promise.resolve(source.charCodeAt(0) === 0xfeff ? source.slice(1).toWellFormed() : source.toWellFormed());
        }
        if (source === null) return Promise.resolve("");
        if (inHand(source)) return Promise.resolve(decodeBody(bytesOf(s)));
        return readAll(source).then(decodeBody);
      } catch (e) {
        return Promise.reject(e);
      }
    };
    const arrayBuffer = function arrayBuffer() {
      try {
        const s = stateOf(this);
        useBody(s);
        return wholeBody(s).then(bufferOf);
      } catch (e) {
        return Promise.reject(e);
      }
    };
    const members = {
      body: { get() { return streamOf(stateOf(this)); } },
      bodyUsed: { get() { return bodyUsed(stateOf(this)); } },
      text: { value: text },
      arrayBuffer: { value: arrayBuffer },
      bytes: { value: function bytes() { return arrayBuffer.call(this).then((b) => new Uint8Array(b)); } },
      json: { value: function json() { return text.call(this).then(parseJson); } },
      blob: { value: function blob() {
        try {
          const type = mimeTypeOf(this.headers.get("content-type"));
          const { Blob } = loadForms();
          return arrayBuffer.call(this).then((b) => new Blob([b], { type }));
        } catch (e) {
          return Promise.reject(e);
        }
      } },
      formData: { value: function formData() {
        try {
          const type = this.headers.get("content-type");
          const { parseForm } = loadForms();
          return arrayBuffer.call(this).then((b) => parseForm(new Uint8Array(b), type));
        } catch (e) {
          return Promise.reject(e);
        }
      } },
    };
    for (const name of Object.keys(members)) {
      Object.defineProperty(proto, name, { ...members[name], configurable: true, enumerable: false });
    }
  };

  // RequestInit's enumerations, each with its default first.
  const REFERRER_POLICIES = ["", "no-referrer", "no-referrer-when-downgrade", "same-origin", "origin", "strict-origin",
    "origin-when-cross-origin", "strict-origin-when-cross-origin", "unsafe-url"];
  const MODES = ["cors", "same-origin", "no-cors", "navigate"];
  const CREDENTIALS = ["same-origin", "omit", "include"];
  const CACHES = ["default", "no-store", "reload", "no-cache", "force-cache", "only-if-cached"];
  const REDIRECTS = ["follow", "error", "manual"];
  const PRIORITIES = ["auto", "high", "low"];
  const member = (init, name, values) => {
    const given = init[name];
    if (given === undefined) return undefined;
    const value = String(given);
    if (!values.includes(value)) throw new TypeError(`Request: ${JSON.stringify(value)} is not a valid ${name}`);
    return value;
  };
  const METHOD = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
  const NORMALIZED = ["DELETE", "GET", "HEAD", "OPTIONS", "POST", "PUT"];
  const normalizeMethod = (given) => {
    const method = String(given);
    if (!METHOD.test(method)) throw new TypeError(`Request: ${JSON.stringify(method)} is not a method`);
    const upper = method.toUpperCase();
    if (upper === "CONNECT" || upper === "TRACE" || upper === "TRACK") throw new TypeError(`Request: ${method} is forbidden`);
    return NORMALIZED.includes(upper) ? upper : method;
  };
  // What a Request's options are without a RequestInit's: [referrer, referrerPolicy, mode, credentials, cache,
  // redirect, integrity, keepalive] ("client" is the referrer "about:client").
  const DEFAULT_OPTIONS = Object.freeze(["client", "", "cors", "same-origin", "default", "follow", "", false]);
  const optionsOf = (from, init) => {
    const o = (from && from[7]) || DEFAULT_OPTIONS;
    if (init === NO_INIT) return o;
    // (An init resets the referrer and its policy.)
    const referrer = init.referrer;
    let referrerValue = "client";
    if (referrer !== undefined) {
      const text = String(referrer);
      if (text === "") referrerValue = "";
      else {
        const parsed = URL.parse(text);
        if (parsed === null) throw new TypeError(`Request: the referrer ${JSON.stringify(text)} is not a URL`);
        referrerValue = parsed.href === "about:client" ? "client" : parsed.href;
      }
    }
    const referrerPolicy = member(init, "referrerPolicy", REFERRER_POLICIES);
    const mode = member(init, "mode", MODES);
    if (mode === "navigate") throw new TypeError("Request: the mode cannot be navigate");
    const credentials = member(init, "credentials", CREDENTIALS);
    const cache = member(init, "cache", CACHES);
    const redirect = member(init, "redirect", REDIRECTS);
    member(init, "priority", PRIORITIES);
    const options = [referrerValue, referrerPolicy ?? "", mode ?? o[2],
      credentials ?? o[3], cache ?? o[4], redirect ?? o[5], init.integrity !== undefined ? String(init.integrity) : o[6],
      init.keepalive !== undefined ? Boolean(init.keepalive) : o[7]];
    if (options[4] === "only-if-cached" && options[2] !== "same-origin") {
      throw new TypeError("Request: the cache only-if-cached needs the mode same-origin");
    }
    return options;
  };

  // A Request's URL: absolute, without credentials.
  const requestUrl = (input) => {
    const parsed = new URL(String(input));
    const href = parsed.href;
    if (href.includes("@") && (parsed.username !== "" || parsed.password !== "")) {
      throw new TypeError("Request: a URL with credentials");
    }
    return href;
  };

  let responseState;
  // Request is a class of Portico's (native.rs): the request a handler gets is made there without
  // JavaScript, and `method` and `url` read there; the rest of the standard is here, on the state array
  // `requestState` gives (made the first time it is needed; a TypeError for anything that is not a Request).
  // A state: [source, bytes, used, method, url, headers (made on first use), Portico's header list until
  // then, options (see DEFAULT_OPTIONS; undefined for the defaults)].
  const { Request, requestState, makeRequest, isRequest } = classes;
  // `new Request(input, init)`'s state.
  const requestInit = (input, init) => {
    if (init === undefined) init = NO_INIT;
    // All that can fail is checked before the input request's body is taken.
    const from = isRequest(input) ? requestState(input) : null;
    const url = from !== null ? from[4] : requestUrl(input);
    if (init === NO_INIT || init === null) {
      // No init (what fetch(url) makes): a GET request, or a copy of the input request that takes its body.
      if (from === null) return [null, undefined, false, "GET", url, new Headers(), null, undefined];
      let source = null;
      if (from[0] !== null) {
        if (unusable(from)) throw new TypeError("Request: the input request's body is already used");
        source = handOver(from);
      }
      const headers = from[5] === undefined ? undefined : new Headers(from[5]);
      return [source, undefined, false, from[3], url, headers, headers === undefined ? from[6] : null, from[7]];
    }
    if (typeof init !== "object" && typeof init !== "function") throw new TypeError("Request: the init is not an object");
    if (init.window !== undefined && init.window !== null) throw new TypeError("Request: the window can only be null");
    const options = optionsOf(from, init);
    const method = init.method !== undefined ? normalizeMethod(init.method) : from ? from[3] : "GET";
    if (options[2] === "no-cors" && method !== "GET" && method !== "HEAD" && method !== "POST") {
      throw new TypeError(`Request: the mode no-cors allows GET, HEAD and POST, not ${method}`);
    }
    const initBody = init.body;
    const hasInitBody = initBody !== undefined && initBody !== null;
    const inputBody = from !== null ? from[0] : null;
    if ((hasInitBody || inputBody !== null) && (method === "GET" || method === "HEAD")) {
      throw new TypeError(`Request: a ${method} request has no body`);
    }
    const duplex = init.duplex;
    if (duplex !== undefined && String(duplex) !== "half") throw new TypeError("Request: the duplex can only be half");
    let headers, raw = null;
    if (init.headers !== undefined) headers = new Headers(init.headers);
    else if (from === null) headers = new Headers();
    else if (from[5] === undefined) raw = from[6]; // Portico's own list, still unsplit
    else headers = new Headers(from[5]);
    let source;
    if (hasInitBody) {
      source = sourceOf(initBody);
      const type = bodyType;
      if (!inHand(source) && duplex === undefined) throw new TypeError("Request: a stream body needs duplex: \"half\"");
      if (!inHand(source) && options[7]) throw new TypeError("Request: a keepalive request cannot have a stream body");
      if (type !== null) {
        if (headers === undefined) {
          trustedList = raw === "" ? [] : raw.split("\0");
          headers = new Headers(TRUSTED_LIST);
          raw = null;
        }
        if (!headers.has("content-type")) headers.append("content-type", type);
      }
      if (inputBody !== null) from[2] = true; // (the input request's body is used even so)
    } else if (inputBody !== null) {
      if (unusable(from)) throw new TypeError("Request: the input request's body is already used");
      source = handOver(from);
    } else source = null;
    return [source, undefined, false, method, url, headers, raw, options === DEFAULT_OPTIONS ? undefined : options];
  };
  // The state of a request Portico made: its URL is absolute and already normalised (not parsed again);
  // `raw` is the header fields as one string, "name\0value\0name\0value" (names lowercase), split only if the
  // handler looks at them; `body` its bytes (an ArrayBuffer), `true` when it is pulled as the handler reads,
  // or null.
  classes.setRequestHelpers(requestInit, (method, url, raw, body) => {
    const source = method === "GET" || method === "HEAD" || body === null ? null
      : body === true ? new NativeBody() : new Uint8Array(body);
    return [source, undefined, false, method, url, undefined, raw];
  });
  const option = (r, i) => (requestState(r)[7] || DEFAULT_OPTIONS)[i];
  const requestMembers = {
    headers: { get() {
      const s = requestState(this);
      if (s[5] === undefined) {
        trustedList = s[6] === "" ? [] : s[6].split("\0");
        s[5] = new Headers(TRUSTED_LIST);
        s[6] = null;
      }
      return s[5];
    } },
    destination: { get() { requestState(this); return ""; } },
    referrer: { get() {
      const referrer = option(this, 0);
      return referrer === "client" ? "about:client" : referrer;
    } },
    referrerPolicy: { get() { return option(this, 1); } },
    mode: { get() { return option(this, 2); } },
    credentials: { get() { return option(this, 3); } },
    cache: { get() { return option(this, 4); } },
    redirect: { get() { return option(this, 5); } },
    integrity: { get() { return option(this, 6); } },
    keepalive: { get() { return option(this, 7); } },
    isReloadNavigation: { get() { requestState(this); return false; } },
    isHistoryNavigation: { get() { requestState(this); return false; } },
    duplex: { get() { requestState(this); return "half"; } },
    clone: { value: function clone() {
      const s = requestState(this);
      const source = tee(s);
      const headers = s[5] === undefined ? undefined : new Headers(s[5]);
      return makeRequest([source, undefined, false, s[3], s[4], headers, headers === undefined ? s[6] : null, s[7]]);
    } },
    [Symbol.toStringTag]: { get() { return "Request"; } },
  };
  for (const key of Reflect.ownKeys(requestMembers)) {
    const member = requestMembers[key];
    if (member.value) member.writable = true;
    Object.defineProperty(Request.prototype, key, { ...member, configurable: true, enumerable: false });
  }
  installBody(Request.prototype, requestState);

  const checkStatus = (given) => {
    const status = Number(given);
    if (!(status >= 200 && status <= 599) || status !== Math.trunc(status)) throw new RangeError(`invalid status ${given}`);
    return status;
  };
  // A reason phrase: tabs, spaces, visible ASCII and obs-text.
  const REASON_PHRASE = /^[\t\x20-\x7e\x80-\xff]*$/;
  const checkStatusText = (given) => {
    const text = String(given);
    if (!REASON_PHRASE.test(text)) throw new TypeError(`invalid status text ${JSON.stringify(text)}`);
    return text;
  };
  // The statuses whose responses have no body.
  // (101 and 103 are too: no Response has those.)
  const nullBodyStatus = (status) => status === 204 || status === 205 || status === 304;
  // A Response's state: [source, bytes, used, status, statusText, headers (null until made), the content-type
  // to add when the headers are made, url]. The content-type is the body's (`bodyType`) unless `type` says.
  const responseOf = (body, init, type) => {
    const source = sourceOf(body);
    if (type === undefined) type = bodyType;
    if (init === NO_INIT) return [source, undefined, false, 200, "", null, type, ""];
    if (init === null || init === undefined) init = NO_INIT;
    const status = init.status === undefined ? 200 : checkStatus(init.status);
    const statusText = init.statusText === undefined ? "" : checkStatusText(init.statusText);
    if (source !== null && status !== 200 && nullBodyStatus(status)) {
      throw new TypeError(`a response with status ${status} has no body`);
    }
    if (init.headers === undefined || init.headers === null) {
      return [source, undefined, false, status, statusText, null, type, ""];
    }
    const headers = init[TRUSTED] ? init.headers : new Headers(init.headers);
    if (type !== null && !headers.has("content-type")) headers.append("content-type", type);
    return [source, undefined, false, status, statusText, headers, null, ""];
  };
  // Response is a class of Portico's (native.rs): `new Response(text)` and `Response.json(data)` without an
  // init are made there without JavaScript, and `status` and `ok` read there; the rest of the standard is
  // here, on the state array `responseState` gives (made the first time it is needed; a TypeError for
  // anything that is not a Response). `setResponseHelpers` hands native.rs the constructor and
  // `Response.json` off their fast paths.
  const { Response, responseState: stateOfResponse, makeResponse: madeBy } = classes;
  responseState = stateOfResponse;
  classes.setResponseHelpers(
    (body, init) => responseOf(body === undefined ? null : body, init === undefined ? NO_INIT : init),
    (data, init) => {
      const text = stringifyJson(data);
      if (text === undefined) throw new TypeError("Response.json: the data has no JSON form");
      return init === undefined ? [text, undefined, false, 200, "", null, JSON_TYPE, ""] : responseOf(text, init, JSON_TYPE);
    },
  );
  const responseMembers = {
    statusText: { get() { return responseState(this)[4]; } },
    headers: { get() {
      const s = responseState(this);
      if (s[5] === null) {
        s[5] = new Headers();
        if (s[6] !== null) s[5].append("content-type", s[6]);
      }
      return s[5];
    } },
    redirected: { get() { return responseState(this)[8] === true; } },
    url: { get() { return responseState(this)[7]; } },
    // (Only Response.error() has the status 0.)
    type: { get() { return responseState(this)[3] === 0 ? "error" : "default"; } },
    clone: { value: function clone() {
      const s = responseState(this);
      const source = tee(s);
      return madeBy([source, undefined, false, s[3], s[4], s[5] === null ? null : new Headers(s[5]), s[6], s[7]]);
    } },
    [Symbol.toStringTag]: { get() { return "Response"; } },
  };
  for (const key of Reflect.ownKeys(responseMembers)) {
    const member = responseMembers[key];
    if (member.value) member.writable = true;
    Object.defineProperty(Response.prototype, key, { ...member, configurable: true, enumerable: false });
  }
  const responseStatics = {
    redirect(url, status = 302) {
      const location = URL.parse(String(url));
      if (location === null) throw new TypeError(`Response.redirect: ${JSON.stringify(String(url))} is not an absolute URL`);
      status = Number(status);
      if (![301, 302, 303, 307, 308].includes(status)) throw new RangeError(`invalid redirect status ${status}`);
      trustedList = ["location", location.href];
      return madeBy([null, undefined, false, status, "", immutable(new Headers(TRUSTED_LIST)), null, ""]);
    },
    // A network error.
    error() { return madeBy([null, undefined, false, 0, "", immutable(new Headers()), null, ""]); },
  };
  for (const key of Object.keys(responseStatics)) {
    Object.defineProperty(Response, key, { value: responseStatics[key], writable: true, configurable: true, enumerable: false });
  }
  installBody(Response.prototype, responseState);

  const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const btoa = (text) => {
    text = String(text);
    let out = "";
    for (let i = 0; i < text.length; i += 3) {
      const a = text.charCodeAt(i), b = text.charCodeAt(i + 1), c = text.charCodeAt(i + 2);
      if (a > 255 || b > 255 || c > 255) throw new DOMException("btoa: a character outside Latin-1", "InvalidCharacterError");
      const n = (a << 16) | ((b || 0) << 8) | (c || 0);
      out += B64[n >> 18] + B64[(n >> 12) & 63] + (i + 1 < text.length ? B64[(n >> 6) & 63] : "=") +
        (i + 2 < text.length ? B64[n & 63] : "=");
    }
    return out;
  };
  const atob = (text) => {
    text = String(text).replace(/[\t\n\f\r ]/g, "");
    if (text.length % 4 === 0) text = text.replace(/==?$/, "");
    if (text.length % 4 === 1 || /[^A-Za-z0-9+/]/.test(text)) {
      throw new DOMException("atob: not base64", "InvalidCharacterError");
    }
    let out = "", bits = 0, value = 0;
    for (const ch of text) {
      value = (value << 6) | B64.indexOf(ch);
      bits += 6;
      if (bits >= 8) { bits -= 8; out += String.fromCharCode((value >> bits) & 255); }
    }
    return out;
  };

  const show = (v) => {
    if (typeof v === "string") return v;
    if (v instanceof Error) return v.stack ? `${v.name}: ${v.message}\n${v.stack}` : `${v.name}: ${v.message}`;
    try { return JSON.stringify(v) ?? String(v); } catch { return String(v); }
  };
  const log = (level) => (...args) => __portico_log(level, args.map(show).join(" "));
  const console = { log: log("info"), info: log("info"), debug: log("debug"), warn: log("warn"), error: log("error") };

  for (const [name, value] of Object.entries({
    Headers, Request, Response, atob, btoa, console,
    queueMicrotask: (f) => { Promise.resolve().then(f); },
  })) define(name, value);

  // Timers, on the worker's event loop (instance.rs): a timer belongs to the call that set it and is cancelled
  // when that call ends, unless `ctx.waitUntil` keeps the call open.
  const timers = new Map();
  let nextOperation = 1; // timers and fetches share the numbers Portico knows them by
  const startTimer = (callback, ms, args, repeat) => {
    const id = nextOperation++;
    if (typeof callback !== "function") throw new TypeError("a timer's callback must be a function");
    const delay = Math.max(0, Number(ms) || 0);
    timers.set(id, { callback, args, repeat: repeat ? delay : null });
    if (!__portico_timer_start(id, delay)) timers.delete(id); // top-level code: no call to belong to
    return id;
  };
  const clearTimer = (id) => {
    if (timers.delete(id)) __portico_timer_cancel(id);
  };
  define("setTimeout", (callback, ms, ...args) => startTimer(callback, ms, args, false));
  define("setInterval", (callback, ms, ...args) => startTimer(callback, ms, args, true));
  define("clearTimeout", clearTimer);
  define("clearInterval", clearTimer);
  define("__portico_timer_fire", (id) => {
    const timer = timers.get(id);
    if (!timer) return;
    if (timer.repeat === null) timers.delete(id);
    else if (!__portico_timer_start(id, timer.repeat)) timers.delete(id);
    try {
      if (typeof timer.callback === "function") timer.callback(...timer.args);
    } catch (e) {
      console.error("uncaught exception in a timer:", e);
    }
  });

  // fetch() to the configuration's clusters: `fetch("http://api/path")` where `api` is a cluster's name, sent
  // through Portico's pools, balancer, health checks, breaker and retries. The answer's body is read whole.
  const fetches = new Map();
  // Sends `request` for the fetch whose promise `pending` settles (`pending.hops`: redirects followed so far).
  const send = (request, pending) => {
    const url = new URL(request.url);
    if (url.protocol !== "http:" && url.protocol !== "https:") throw new TypeError(`fetch: unsupported scheme ${url.protocol}`);
    const signal = pending.signal;
    if (signal && signal.aborted) throw signal.reason;
    const bytes = bytesOf(requestState(request));
    const id = nextOperation++;
    const parts = [request.method, url.hostname, url.host, url.pathname + url.search, url.protocol, url.port];
    __portico_fetch(id, parts, request.headers.__flat(), bytes ? bufferOf(bytes) : null);
    pending.request = request;
    fetches.set(id, pending);
    if (signal && typeof signal.addEventListener === "function") {
      signal.addEventListener("abort", () => {
        if (fetches.delete(id)) { __portico_timer_cancel(id); pending.reject(signal.reason); }
      });
    }
  };
  // Redirects are followed as the Fetch Standard says (`redirect: "follow"`, at most 20; 303, and 301/302 after
  // a POST, go on as GET without a body), to wherever a fetch may go (a cluster); `redirect: "manual"` returns
  // them, `redirect: "error"` rejects. (Handled as the answers come, so that a fetch that is not redirected
  // costs one promise.)
  const REDIRECT_STATUSES = [301, 302, 303, 307, 308];
  define("fetch", (input, init) => new Promise((resolve, reject) => {
    let request = input instanceof Request && init === undefined ? input : new Request(input, init);
    // (The Request checked the mode: its init's, or the Request's given as the input.)
    const mode = request.redirect;
    const pending = { resolve, reject, mode, hops: 0, signal: init?.signal, request };
    const source = requestState(request)[0];
    if (inHand(source)) return send(request, pending);
    // A streamed body is read whole first: fetch sends bodies in hand (and a 307 or 308 sends it again).
    readAll(source).then((bytes) => send(new Request(request, { body: bytes }), pending)).catch(reject);
  }));
  // The next request of a redirected fetch, or a TypeError saying why there is none.
  const redirected = (pending, status, location) => {
    const request = pending.request;
    if (pending.mode === "error") {
      throw new TypeError(`fetch to ${request.url}: redirected${location === null ? "" : ` to ${location}`} (redirect: "error")`);
    }
    if (pending.hops === 20) throw new TypeError(`fetch to ${request.url}: more than 20 redirects`);
    let next;
    try { next = new URL(location, request.url).href; } catch { throw new TypeError(`fetch to ${request.url}: a redirect to an invalid URL (${location})`); }
    const asGet = status === 303 ? request.method !== "HEAD" : status <= 302 && request.method === "POST";
    const headers = new Headers(request.headers);
    if (asGet) for (const name of ["content-type", "content-length", "content-encoding", "content-language", "content-location"]) headers.delete(name);
    if (new URL(next).origin !== new URL(request.url).origin) headers.delete("authorization");
    pending.hops++;
    return new Request(next, { method: asGet ? "GET" : request.method, headers, body: asGet ? null : bytesOf(requestState(request)) });
  };
  define("__portico_fetched", (id, status, pairs, body) => {
    const pending = fetches.get(id);
    if (!pending) return;
    fetches.delete(id);
    const url = pending.request.url;
    if (!(status >= 200 && status <= 599)) {
      pending.reject(new TypeError(`fetch to ${url}: the upstream answered status ${status}, which a Response cannot have`));
      return;
    }
    trustedList = pairs;
    const headers = new Headers(TRUSTED_LIST);
    if (pending.mode !== "manual" && REDIRECT_STATUSES.includes(status)) {
      const location = headers.get("location");
      if (location !== null || pending.mode === "error") {
        try { send(redirected(pending, status, location), pending); } catch (e) { pending.reject(e); }
        return;
      }
    }
    const source = nullBodyStatus(status) ? null : new Uint8Array(body);
    const state = [source, undefined, false, status, "", headers, null, url];
    if (pending.hops > 0) state[8] = true;
    pending.resolve(madeBy(state));
  });
  define("__portico_fetch_failed", (id, message) => {
    const pending = fetches.get(id);
    if (!pending) return;
    fetches.delete(id);
    pending.reject(new TypeError(message));
  });

  // Operations cancelled because the call that started them ended: their callbacks are dropped and their
  // promises rejected, so that nothing waits for them forever (another request may share such a promise).
  define("__portico_forget", (ids) => {
    for (const id of ids) {
      timers.delete(id);
      const ended = new TypeError("the request that started this operation has ended");
      const fetched = fetches.get(id);
      if (fetched) { fetches.delete(id); fetched.reject(ended); }
      const pull = bodyPulls.get(id);
      if (pull) { bodyPulls.delete(id); pull.reject(ended); }
    }
  });

  // The handler's third argument. `waitUntil` keeps the call (its timers and fetches) open after the response
  // until the promise settles, within the wall limit.
  const callContext = Object.freeze({
    waitUntil(promise) {
      __portico_wait_until(Promise.resolve(promise).catch((e) => console.error("waitUntil promise rejected:", e)));
    },
    passThroughOnException() {},
  });
  define("__portico_call_context", callContext);
  // A filter's `onRequest`: a Response answers; anything else lets the request go on, as the hook left it
  // (its headers changed in place) or as the Request it returned.
  const PASSED = Symbol("the request goes on");
  define("__portico_filter", (hook, target, request, env) => {
    const settle = (value) => (value instanceof Response ? value : { [PASSED]: value instanceof Request ? value : request });
    const out = hook.call(target, request, env, callContext);
    return out && typeof out.then === "function" ? Promise.resolve(out).then(settle) : settle(out);
  });

  // A filter's `onResponse`: given the response's status and a Headers that starts empty, whatever it sets
  // there is set on the response and whatever it deletes is removed. Answers [set (flat), removed names].
  define("__portico_on_response", (hook, target, status, request, env) => {
    const removed = [];
    class ResponseEdits extends Headers {
      delete(name) { removed.push(normalizeName(name)); super.delete(name); }
    }
    const headers = new ResponseEdits();
    const response = new Response(null, { status: status < 200 ? 200 : status, headers, [TRUSTED]: true });
    return Promise.resolve(hook.call(target, response, request, env, callContext)).then(() => [headers.__flat(), removed]);
  });

  // Portico's side: a response out (native.rs makes the request).
  // Response bodies streamed from JavaScript: Portico asks for one chunk at a time, as the client takes them.
  const outgoing = new Map();
  define("__portico_stream_read", (id) => {
    const reader = outgoing.get(id);
    if (!reader) return __portico_stream_fail(id, "the stream is gone");
    reader.read().then(({ done, value }) => {
      if (done) { outgoing.delete(id); __portico_stream_push(id, null); return; }
      const bytes = toBytes(value);
      __portico_stream_push(id, bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
    }, (e) => {
      outgoing.delete(id);
      __portico_stream_fail(id, e instanceof Error ? `${e.name}: ${e.message}` : String(e));
    });
  });
  define("__portico_stream_cancel", (id) => {
    const reader = outgoing.get(id);
    outgoing.delete(id);
    if (reader) reader.cancel().catch(() => {});
  });
  define("__portico_response", (value) => {
    if (!(value instanceof Response) && value && value[PASSED]) {
      const request = value[PASSED];
      const url = new URL(request.url);
      return [0, request.headers.__flat(), null, url.pathname + url.search];
    }
    if (!(value instanceof Response)) {
      throw new TypeError(`the handler returned ${value === undefined ? "nothing" : Object.prototype.toString.call(value)}, not a Response`);
    }
    // [status, header list, body, next, stream, content-type]: a response whose headers were never made has
    // only its default content-type (or none), given instead of a list.
    const s = responseState(value);
    if (s[3] === 0) throw new TypeError("the handler returned Response.error(), a network error");
    const source = s[0];
    const list = s[5] === null ? null : s[5].__flat();
    if (typeof source === "string" || source === null) return [s[3], list, source, undefined, undefined, s[6]];
    if (source instanceof NativeBody) {
      // The request body, untouched, as the response's: Portico pipes it without JavaScript.
      return [s[3], list, null, undefined, -1, s[6]];
    }
    if (isStream(source)) {
      const id = nextOperation++;
      outgoing.set(id, source.getReader());
      return [s[3], list, null, undefined, id, s[6]];
    }
    return [s[3], list, bufferOf(source), undefined, undefined, s[6]];
  });
})();
