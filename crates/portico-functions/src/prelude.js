// The Web API subset a fetch handler uses, on top of QuickJS-ng: Headers, Request, Response, atob, btoa,
// console, queueMicrotask (URL, TextEncoder, crypto, DOMException and more: webapi.rs). Evaluated once per runtime,
// before the function's own code. `__portico_*` globals are how Portico hands requests in and takes
// responses out; `__portico_log` is native.
(() => {
  "use strict";
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
  const knownNames = new Map();
  const normalizeName = (name) => {
    name = String(name);
    const known = knownNames.get(name);
    if (known !== undefined) return known;
    const lower = name.toLowerCase();
    if (!/^[!#$%&'*+\-.^_`|~0-9a-z]+$/.test(lower)) throw new TypeError(`invalid header name ${name}`);
    if (knownNames.size < 512) knownNames.set(name, lower);
    return lower;
  };
  const normalizeValue = (value) => {
    value = String(value);
    const first = value.charCodeAt(0), last = value.charCodeAt(value.length - 1);
    if (first > 32 && last > 32) return value; // nothing to trim (most values)
    return value.replace(/^[\t\n\r ]+|[\t\n\r ]+$/g, "");
  };

  // A list Portico made (names lowercase, values trimmed) handed to `new Headers(TRUSTED_LIST)`.
  const TRUSTED_LIST = Object.freeze({});
  let trustedList = null;

  // Kept as one flat list, name, value, name, value...: a request's headers are read far more often than
  // changed, and a flat list costs one array.
  class Headers {
    #list = [];
    constructor(init) {
      if (init === undefined || init === null) return;
      if (init === TRUSTED_LIST) {
        this.#list = trustedList;
        trustedList = null;
        return;
      }
      if (init instanceof Headers) this.#list = init.__flat().slice();
      else if (init[TRUSTED]) this.#list = init[TRUSTED]; // Portico's own: names lowercase, values trimmed
      else if (typeof init[Symbol.iterator] === "function") {
        for (const pair of init) {
          if (pair.length !== 2) throw new TypeError("a header pair has two items");
          this.append(pair[0], pair[1]);
        }
      } else if (typeof init === "object") for (const k of Object.keys(init)) this.append(k, init[k]);
    }
    append(name, value) { this.#list.push(normalizeName(name), normalizeValue(value)); }
    set(name, value) {
      name = normalizeName(name);
      value = normalizeValue(value);
      const list = this.#list;
      let found = false;
      for (let i = 0; i < list.length; ) {
        if (list[i] !== name) { i += 2; continue; }
        if (!found) { list[i + 1] = value; found = true; i += 2; } else list.splice(i, 2);
      }
      if (!found) list.push(name, value);
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
      for (let i = 0; i < list.length; ) {
        if (list[i] === name) list.splice(i, 2);
        else i += 2;
      }
    }
    // Sorted by name, repeated names joined (but each set-cookie apart), as the Fetch standard iterates.
    #sorted() {
      const names = [];
      for (let i = 0; i < this.#list.length; i += 2) if (!names.includes(this.#list[i])) names.push(this.#list[i]);
      names.sort();
      const out = [];
      for (const name of names) {
        if (name === "set-cookie") for (const v of this.getSetCookie()) out.push([name, v]);
        else out.push([name, this.get(name)]);
      }
      return out;
    }
    entries() { return this.#sorted()[Symbol.iterator](); }
    keys() { return this.#sorted().map(([k]) => k)[Symbol.iterator](); }
    values() { return this.#sorted().map(([, v]) => v)[Symbol.iterator](); }
    forEach(callback, thisArg) { for (const [k, v] of this.#sorted()) callback.call(thisArg, v, k, this); }
    [Symbol.iterator]() { return this.entries(); }
    get [Symbol.toStringTag]() { return "Headers"; }
    // The list itself, name, value, ...: for Portico, and for copying.
    __flat() { return this.#list; }
  }

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
        const c = toBytes(value);
        chunks.push(c);
        length += c.byteLength;
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
  // Portico's own requests and responses are made with `PORTICO` as their init and their state in `portico`.
  const PORTICO = Object.freeze({});
  let portico = null;
  const sourceOf = (body) => body === null || body === undefined ? null
    : typeof body === "string" || body instanceof NativeBody || isStream(body) ? body : toBytes(body);
  const inHand = (source) => !(source instanceof NativeBody) && !isStream(source);
  const bodyUsed = (s) => s[2] || (isStream(s[0]) && s[0].locked);
  const useBody = (s) => {
    if (bodyUsed(s)) throw new TypeError("body already used");
    s[2] = true;
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
    const stream = source instanceof NativeBody ? nativeStream() : new globalThis.ReadableStream({
      start(controller) { controller.enqueue(toBytes(source)); controller.close(); },
    });
    s[0] = stream;
    return stream;
  };
  // The body to give a new Request or Response made from this one: a stream is handed over (this one is used
  // from then on), bytes are shared.
  const handOver = (s) => {
    if (inHand(s[0])) return bytesOf(s);
    useBody(s);
    return s[0];
  };
  // For clone(): a streamed body split in two, one branch kept, the other returned.
  const tee = (s) => {
    if (inHand(s[0])) return bytesOf(s);
    if (bodyUsed(s)) throw new TypeError("body already used");
    const [mine, theirs] = streamOf(s).tee();
    s[0] = mine;
    return theirs;
  };
  const bufferOf = (b) => b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
  // The Body mixin's members, on Request.prototype and Response.prototype; `stateOf` checks the brand. The
  // read methods answer at once for a body in hand (no async function's machinery).
  const installBody = (proto, stateOf) => {
    const text = function text() {
      try {
        const s = stateOf(this);
        useBody(s);
        const source = s[0];
        if (typeof source === "string") return Promise.resolve(source);
        if (source === null) return Promise.resolve("");
        if (inHand(source)) return Promise.resolve(fastDecode(bytesOf(s)));
        return readAll(source).then(fastDecode);
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
      formData: { value: function formData() { return Promise.reject(new TypeError("formData() is not supported")); } },
    };
    for (const name of Object.keys(members)) {
      Object.defineProperty(proto, name, { ...members[name], configurable: true, enumerable: false });
    }
  };

  let requestState, responseState;
  class Request {
    // [source, bytes, used, method, url, headers (made on first use), Portico's header list until then]
    #s;
    constructor(input, init = NO_INIT) {
      if (init === PORTICO) {
        // Portico's request: the URL is absolute and normalised, the headers are made on first use.
        this.#s = portico;
        return;
      }
      const from = input instanceof Request ? input : null;
      const source = sourceOf(init.body !== undefined ? init.body : from ? handOver(from.#s) : null);
      const method = init.method ? String(init.method).toUpperCase() : from ? from.method : "GET";
      const url = from ? from.url : new URL(String(input)).href;
      this.#s = [source, undefined, false, method, url, new Headers(init.headers || (from ? from.headers : undefined)), null];
    }
    get method() { return this.#s[3]; }
    get url() { return this.#s[4]; }
    get headers() {
      const s = this.#s;
      if (s[5] === undefined) {
        trustedList = s[6] === "" ? [] : s[6].split("\0");
        s[5] = new Headers(TRUSTED_LIST);
        s[6] = null;
      }
      return s[5];
    }
    clone() { return new Request(this, { body: tee(this.#s) }); }
    get [Symbol.toStringTag]() { return "Request"; }
    static { requestState = (r) => r.#s; }
  }
  installBody(Request.prototype, requestState);

  const TEXT_TYPE = "text/plain;charset=UTF-8";
  const checkStatus = (given) => {
    const status = Number(given);
    if (!(status >= 200 && status <= 599) || status !== Math.trunc(status)) throw new RangeError(`invalid status ${given}`);
    return status;
  };
  // A Response's state: [source, bytes, used, status, statusText, headers (null until made), the content-type
  // to add when the headers are made, url].
  const responseOf = (body, init, type) => {
    if (init === NO_INIT) return [sourceOf(body), undefined, false, 200, "", null, type, ""];
    const status = init.status === undefined ? 200 : checkStatus(init.status);
    const statusText = init.statusText === undefined ? "" : String(init.statusText);
    if (init.headers === undefined || init.headers === null) return [sourceOf(body), undefined, false, status, statusText, null, type, ""];
    const headers = init[TRUSTED] ? init.headers : new Headers(init.headers);
    if (type !== null && !headers.has("content-type")) headers.set("content-type", type);
    return [sourceOf(body), undefined, false, status, statusText, headers, null, ""];
  };
  class Response {
    #s;
    constructor(body = null, init = NO_INIT) {
      this.#s = init === PORTICO ? portico : responseOf(body, init, typeof body === "string" ? TEXT_TYPE : null);
    }
    get status() { return this.#s[3]; }
    get statusText() { return this.#s[4]; }
    get ok() { return this.#s[3] >= 200 && this.#s[3] < 300; }
    get headers() {
      const s = this.#s;
      if (s[5] === null) {
        s[5] = new Headers();
        if (s[6] !== null) s[5].append("content-type", s[6]);
      }
      return s[5];
    }
    get redirected() { return this.#s[8] === true; }
    get url() { return this.#s[7]; }
    get type() { return "default"; }
    clone() { return new Response(tee(this.#s), { status: this.#s[3], statusText: this.#s[4], headers: this.headers }); }
    static json(data, init = NO_INIT) {
      portico = responseOf(stringifyJson(data), init, "application/json");
      try {
        return new Response(null, PORTICO);
      } finally {
        portico = null;
      }
    }
    static redirect(url, status = 302) {
      if (![301, 302, 303, 307, 308].includes(status)) throw new RangeError(`invalid redirect status ${status}`);
      return new Response(null, { status, headers: { location: new URL(String(url)).href } });
    }
    static error() { throw new TypeError("Response.error() is not supported"); }
    get [Symbol.toStringTag]() { return "Response"; }
    static { responseState = (r) => r.#s; }
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
  const REDIRECTS = [301, 302, 303, 307, 308];
  define("fetch", (input, init) => new Promise((resolve, reject) => {
    let request = input instanceof Request && init === undefined ? input : new Request(input, init);
    const mode = init?.redirect === undefined ? "follow" : String(init.redirect);
    if (mode !== "follow" && mode !== "manual" && mode !== "error") {
      throw new TypeError(`fetch: redirect must be "follow", "manual" or "error", not "${mode}"`);
    }
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
    let response;
    try {
      response = new Response(status === 204 || status === 304 ? null : body, { status, headers: { [TRUSTED]: pairs } });
    } catch (e) {
      pending.reject(new TypeError(`fetch to ${url}: the upstream answered status ${status}, which a Response cannot have`));
      return;
    }
    if (pending.mode !== "manual" && REDIRECTS.includes(status)) {
      const location = response.headers.get("location");
      if (location !== null || pending.mode === "error") {
        try { send(redirected(pending, status, location), pending); } catch (e) { pending.reject(e); }
        return;
      }
    }
    const state = responseState(response);
    state[7] = url;
    if (pending.hops > 0) state[8] = true;
    pending.resolve(response);
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

  // Portico's side: a request in, a response out.
  // Portico's URL is absolute and already normalised: not parsed again.
  // `raw`: the header fields as one string, "name\0value\0name\0value" (names lowercase), split only if the
  // handler looks at them.
  define("__portico_request", (method, url, raw, body) => {
    const source = method === "GET" || method === "HEAD" || body === null ? null
      : body === true ? new NativeBody() : new Uint8Array(body);
    portico = [source, undefined, false, method, url, undefined, raw];
    const request = new Request(url, PORTICO);
    portico = null;
    return request;
  });
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
