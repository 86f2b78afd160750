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

  // Kept as one flat list, name, value, name, value...: a request's headers are read far more often than
  // changed, and a flat list costs one array.
  class Headers {
    #list = [];
    constructor(init) {
      if (init === undefined || init === null) return;
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

  // Each of Body, Request and Response keeps its state in one array in one private field: QuickJS pays for
  // every property an object gains (about a thousand instructions each), so fewer fields make a request cheaper.
  const NO_INIT = Object.freeze({});
  // Portico's own requests are made with `PORTICO` as their init, their parts in `portico` (no object per request).
  const PORTICO = Object.freeze({});
  let portico = null;
  class Body {
    // [source, bytes, used]: a body is kept as it was given (a string stays a string, a stream a stream), its
    // bytes made when asked.
    #b;
    constructor(body) {
      const source = body === null || body === undefined ? null
        : typeof body === "string" || body instanceof NativeBody || isStream(body) ? body : toBytes(body);
      this.#b = [source, undefined, false];
    }
    get body() {
      const b = this.#b;
      const source = b[0];
      if (source === null || isStream(source)) return source;
      const stream = source instanceof NativeBody ? nativeStream() : new globalThis.ReadableStream({
        start(controller) { controller.enqueue(toBytes(source)); controller.close(); },
      });
      b[0] = stream;
      return stream;
    }
    get bodyUsed() { return this.#b[2] || (isStream(this.#b[0]) && this.#b[0].locked); }
    #use() {
      if (this.bodyUsed) throw new TypeError("body already used");
      this.#b[2] = true;
    }
    async #whole() {
      const source = this.#b[0];
      if (source instanceof NativeBody || isStream(source)) return readAll(source);
      return this.__bytes() || new Uint8Array(0);
    }
    async arrayBuffer() { this.#use(); const b = await this.#whole(); return b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength); }
    async bytes() { return new Uint8Array(await this.arrayBuffer()); }
    async text() {
      this.#use();
      const source = this.#b[0];
      if (typeof source === "string") return source;
      if (source === null) return "";
      return fastDecode(await this.#whole());
    }
    async json() { return JSON.parse(await this.text()); }
    async formData() { throw new TypeError("formData() is not supported"); }
    // The bytes of a body in hand (`null` for none; a stream's are not in hand: see `__source`).
    __bytes() {
      const b = this.#b;
      if (b[1] === undefined) {
        const source = b[0];
        b[1] = typeof source === "string" ? toBytes(source) : source instanceof NativeBody || isStream(source) ? null : source;
      }
      return b[1];
    }
    __source() { return this.#b[0]; }
    __readAll() { return this.#whole(); }
    // The body to give a new Request or Response made from this one: a stream is handed over (this one is
    // used from then on), bytes are shared.
    __handOver() {
      const source = this.#b[0];
      if (source instanceof NativeBody || isStream(source)) {
        if (this.bodyUsed) throw new TypeError("body already used");
        this.#b[2] = true;
        return source;
      }
      return this.__bytes();
    }
    // For clone(): a streamed body split in two, one branch kept, the other returned.
    __tee() {
      const source = this.#b[0];
      if (!(source instanceof NativeBody) && !isStream(source)) return this.__bytes();
      if (this.bodyUsed) throw new TypeError("body already used");
      const [mine, theirs] = this.body.tee();
      this.#b[0] = mine;
      return theirs;
    }
  }

  class Request extends Body {
    #r; // [method, url, headers, Portico's raw header list until the headers are first asked for]
    constructor(input, init = NO_INIT) {
      if (init === PORTICO) {
        // Portico's request: the URL is absolute and normalised, the headers are made on first use.
        const [method, flat, body] = portico;
        super(body);
        this.#r = [method, input, undefined, flat];
        return;
      }
      const from = input instanceof Request ? input : null;
      super(init.body !== undefined ? init.body : from ? from.__handOver() : null);
      const method = init.method ? String(init.method).toUpperCase() : from ? from.method : "GET";
      const url = from ? from.url : new URL(String(input)).href;
      this.#r = [method, url, new Headers(init.headers || (from ? from.headers : undefined)), null];
    }
    get method() { return this.#r[0]; }
    get url() { return this.#r[1]; }
    get headers() {
      const r = this.#r;
      if (r[2] === undefined) {
        const raw = r[3];
        r[3] = null;
        const list = [];
        for (let i = 0; i < raw.length; i += 2) list.push(normalizeName(raw[i]), raw[i + 1]);
        r[2] = new Headers({ [TRUSTED]: list });
      }
      return r[2];
    }
    clone() { return new Request(this, { body: this.__tee() }); }
    get [Symbol.toStringTag]() { return "Request"; }
  }

  const DEFAULT_TYPE = Symbol("content-type unless the headers say");
  class Response extends Body {
    // [status, statusText, headers (made on first use), url, the content-type to add when the headers are made]
    #r;
    constructor(body = null, init = NO_INIT) {
      super(body);
      let status = 200;
      if (init.status !== undefined) {
        status = Number(init.status);
        if (!(status >= 200 && status <= 599) || status !== Math.trunc(status)) throw new RangeError(`invalid status ${init.status}`);
      }
      const statusText = init.statusText === undefined ? "" : String(init.statusText);
      const type = init[DEFAULT_TYPE] || (typeof body === "string" ? "text/plain;charset=UTF-8" : null);
      if (init.headers === undefined || init.headers === null) {
        this.#r = [status, statusText, null, "", type];
        return;
      }
      const headers = init[TRUSTED] ? init.headers : new Headers(init.headers);
      if (type !== null && !headers.has("content-type")) headers.set("content-type", type);
      this.#r = [status, statusText, headers, "", null];
    }
    get status() { return this.#r[0]; }
    get statusText() { return this.#r[1]; }
    get ok() { return this.#r[0] >= 200 && this.#r[0] < 300; }
    get headers() {
      const r = this.#r;
      if (r[2] === null) {
        r[2] = new Headers();
        if (r[4] !== null) r[2].append("content-type", r[4]);
      }
      return r[2];
    }
    get redirected() { return false; }
    get url() { return this.#r[3]; }
    __setUrl(url) { this.#r[3] = url; }
    // The header list for Portico, without making a Headers when the response has only its default type.
    __headerList() {
      const r = this.#r;
      if (r[2] !== null) return r[2].__flat();
      return r[4] === null ? [] : ["content-type", r[4]];
    }
    get type() { return "default"; }
    clone() { return new Response(this.__tee(), { status: this.#r[0], statusText: this.#r[1], headers: this.headers }); }
    static json(data, init = NO_INIT) {
      return new Response(JSON.stringify(data), {
        status: init.status, statusText: init.statusText, headers: init.headers, [DEFAULT_TYPE]: "application/json",
      });
    }
    static redirect(url, status = 302) {
      if (![301, 302, 303, 307, 308].includes(status)) throw new RangeError(`invalid redirect status ${status}`);
      return new Response(null, { status, headers: { location: new URL(String(url)).href } });
    }
    static error() { throw new TypeError("Response.error() is not supported"); }
    get [Symbol.toStringTag]() { return "Response"; }
  }

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
  define("fetch", (input, init) => new Promise((resolve, reject) => {
    const request = input instanceof Request && init === undefined ? input : new Request(input, init);
    const url = new URL(request.url);
    if (url.protocol !== "http:" && url.protocol !== "https:") throw new TypeError(`fetch: unsupported scheme ${url.protocol}`);
    if (init && init.signal && init.signal.aborted) throw init.signal.reason;
    const source = request.__source();
    if (source instanceof NativeBody || isStream(source)) {
      // A streamed body is read whole first (fetch sends bodies in hand).
      request.__readAll().then((bytes) => resolve(fetch(new Request(request, { body: bytes }))), reject);
      return;
    }
    const bytes = request.__bytes();
    const body = bytes ? bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) : null;
    const id = nextOperation++;
    const parts = [request.method, url.hostname, url.host, url.pathname + url.search, url.protocol, url.port];
    __portico_fetch(id, parts, request.headers.__flat(), body);
    fetches.set(id, { resolve, reject, url: request.url });
    if (init && init.signal && typeof init.signal.addEventListener === "function") {
      init.signal.addEventListener("abort", () => {
        if (fetches.delete(id)) { __portico_timer_cancel(id); reject(init.signal.reason); }
      });
    }
  }));
  define("__portico_fetched", (id, status, pairs, body) => {
    const pending = fetches.get(id);
    if (!pending) return;
    fetches.delete(id);
    let response;
    try {
      response = new Response(status === 204 || status === 304 ? null : body, { status, headers: { [TRUSTED]: pairs } });
    } catch (e) {
      pending.reject(new TypeError(`fetch to ${pending.url}: the upstream answered status ${status}, which a Response cannot have`));
      return;
    }
    response.__setUrl(pending.url);
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
  define("__portico_call", (handler, target, request, env) => handler.call(target, request, env, callContext));
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
  define("__portico_request", (method, url, flat, body) => {
    portico = [method, flat, method === "GET" || method === "HEAD" ? null : body === true ? new NativeBody() : body];
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
    const source = value.__source();
    if (typeof source === "string") return [value.status, value.__headerList(), source];
    if (source instanceof NativeBody) {
      // The request body, untouched, as the response's: Portico pipes it without JavaScript.
      return [value.status, value.__headerList(), null, undefined, -1];
    }
    if (isStream(source)) {
      const id = nextOperation++;
      outgoing.set(id, source.getReader());
      return [value.status, value.__headerList(), null, undefined, id];
    }
    return [value.status, value.__headerList(),
      source === null ? null : source.buffer.slice(source.byteOffset, source.byteOffset + source.byteLength)];
  });
})();
