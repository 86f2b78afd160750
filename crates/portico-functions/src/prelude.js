// The Web API subset a fetch handler uses, on top of QuickJS-ng: Headers, Request, Response, TextEncoder,
// TextDecoder, atob, btoa, console, queueMicrotask (URL, DOMException and more: webapi.rs). Evaluated once per runtime,
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

  class TextEncoder {
    get encoding() { return "utf-8"; }
    encode(text = "") { return fastEncode(text); }
  }
  class TextDecoder {
    constructor(label = "utf-8") {
      if (!/^(utf-?8|unicode-1-1-utf-8)$/i.test(String(label).trim())) throw new RangeError(`unsupported encoding ${label}`);
    }
    get encoding() { return "utf-8"; }
    decode(input) { return input === undefined ? "" : fastDecode(toBytes(input)); }
  }

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

  class Headers {
    #list = [];
    constructor(init) {
      if (init instanceof Headers) init.forEach((v, k) => this.append(k, v));
      else if (Array.isArray(init)) for (const [k, v] of init) this.append(k, v);
      else if (init && typeof init === "object") for (const k of Object.keys(init)) this.append(k, init[k]);
    }
    append(name, value) { this.#list.push([normalizeName(name), normalizeValue(value)]); }
    set(name, value) {
      name = normalizeName(name);
      const at = this.#list.findIndex(([k]) => k === name);
      this.#list = this.#list.filter(([k], i) => k !== name || i === at);
      if (at < 0) this.#list.push([name, normalizeValue(value)]);
      else this.#list[this.#list.findIndex(([k]) => k === name)][1] = normalizeValue(value);
    }
    get(name) {
      name = normalizeName(name);
      const values = this.#list.filter(([k]) => k === name).map(([, v]) => v);
      return values.length ? values.join(", ") : null;
    }
    getSetCookie() { return this.#list.filter(([k]) => k === "set-cookie").map(([, v]) => v); }
    has(name) { name = normalizeName(name); return this.#list.some(([k]) => k === name); }
    delete(name) { name = normalizeName(name); this.#list = this.#list.filter(([k]) => k !== name); }
    *entries() {
      const names = [...new Set(this.#list.map(([k]) => k))].sort();
      for (const name of names) {
        if (name === "set-cookie") for (const v of this.getSetCookie()) yield [name, v];
        else yield [name, this.get(name)];
      }
    }
    keys() { return [...this.entries()].map(([k]) => k)[Symbol.iterator](); }
    values() { return [...this.entries()].map(([, v]) => v)[Symbol.iterator](); }
    forEach(callback, thisArg) { for (const [k, v] of this.entries()) callback.call(thisArg, v, k, this); }
    [Symbol.iterator]() { return this.entries(); }
    get [Symbol.toStringTag]() { return "Headers"; }
    __pairs() { return this.#list.map(([k, v]) => [k, v]); }
  }

  // A body is kept as it was given (a string stays a string) and turned into bytes only when asked.
  class Body {
    #source; #bytes; #used = false;
    constructor(body) {
      this.#source = body === null || body === undefined ? null : typeof body === "string" ? body : toBytes(body);
    }
    get body() { return this.__bytes(); }
    get bodyUsed() { return this.#used; }
    #use() {
      if (this.#used) throw new TypeError("body already used");
      this.#used = true;
    }
    async arrayBuffer() { this.#use(); const b = this.__bytes() || new Uint8Array(0); return b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength); }
    async bytes() { return new Uint8Array(await this.arrayBuffer()); }
    async text() {
      this.#use();
      if (typeof this.#source === "string") return this.#source;
      return this.#source === null ? "" : fastDecode(this.#source);
    }
    async json() { return JSON.parse(await this.text()); }
    async formData() { throw new TypeError("formData() is not supported"); }
    __bytes() {
      if (this.#bytes === undefined) this.#bytes = typeof this.#source === "string" ? toBytes(this.#source) : this.#source;
      return this.#bytes;
    }
    __source() { return this.#source; }
  }

  class Request extends Body {
    #method; #url; #headers;
    constructor(input, init = {}) {
      const from = input instanceof Request ? input : null;
      super(init.body !== undefined ? init.body : from ? from.__bytes() : null);
      this.#url = from ? from.url : init[TRUSTED] ? input : new URL(String(input)).href;
      this.#method = String(init.method || (from ? from.method : "GET")).toUpperCase();
      this.#headers = new Headers(init.headers || (from ? from.headers : undefined));
    }
    get method() { return this.#method; }
    get url() { return this.#url; }
    get headers() { return this.#headers; }
    clone() { return new Request(this); }
    get [Symbol.toStringTag]() { return "Request"; }
  }

  class Response extends Body {
    #status; #statusText; #headers;
    constructor(body = null, init = {}) {
      super(body);
      const status = init.status === undefined ? 200 : Number(init.status);
      if (!Number.isInteger(status) || status < 200 || status > 599) throw new RangeError(`invalid status ${init.status}`);
      this.#status = status;
      this.#statusText = init.statusText === undefined ? "" : String(init.statusText);
      this.#headers = new Headers(init.headers);
      if (typeof body === "string" && !this.#headers.has("content-type")) {
        this.#headers.set("content-type", "text/plain;charset=UTF-8");
      }
    }
    get status() { return this.#status; }
    get statusText() { return this.#statusText; }
    get ok() { return this.#status >= 200 && this.#status < 300; }
    get headers() { return this.#headers; }
    get redirected() { return false; }
    get type() { return "default"; }
    clone() { return new Response(this.__bytes(), { status: this.#status, statusText: this.#statusText, headers: this.#headers }); }
    static json(data, init = {}) {
      const headers = new Headers(init.headers);
      if (!headers.has("content-type")) headers.set("content-type", "application/json");
      return new Response(JSON.stringify(data), { ...init, headers });
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

  // Web Crypto: random values, digests and HMAC, on the system's generator and `ring` (crypto.rs).
  const bufferSource = (data) => {
    if (data instanceof ArrayBuffer) return new Uint8Array(data);
    if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    throw new TypeError("expected an ArrayBuffer or a typed array");
  };
  const algorithmName = (a) => String(typeof a === "string" ? a : a && a.name).toUpperCase();
  const notSupported = (what) => new DOMException(`${what} is not supported`, "NotSupportedError");
  const keyBytes = new WeakMap();
  class CryptoKey {
    #algorithm; #extractable; #usages;
    constructor(algorithm, extractable, usages) { this.#algorithm = algorithm; this.#extractable = extractable; this.#usages = usages; }
    get type() { return "secret"; }
    get algorithm() { return this.#algorithm; }
    get extractable() { return this.#extractable; }
    get usages() { return this.#usages; }
    get [Symbol.toStringTag]() { return "CryptoKey"; }
  }
  const hmac = (key, data, usage) => {
    if (!(key instanceof CryptoKey) || key.algorithm.name !== "HMAC") throw new DOMException("not an HMAC key", "InvalidAccessError");
    if (!key.usages.includes(usage)) throw new DOMException(`the key cannot ${usage}`, "InvalidAccessError");
    const b = bufferSource(data);
    return __portico_hmac(key.algorithm.hash.name, keyBytes.get(key), b.buffer, b.byteOffset, b.byteLength);
  };
  const subtle = {
    async digest(algorithm, data) {
      const b = bufferSource(data);
      return __portico_digest(algorithmName(algorithm), b.buffer, b.byteOffset, b.byteLength);
    },
    async importKey(format, keyData, algorithm, extractable, usages) {
      if (format !== "raw") throw notSupported(`key format ${format}`);
      if (algorithmName(algorithm) !== "HMAC") throw notSupported(`importKey for ${algorithmName(algorithm)}`);
      const hash = algorithmName(algorithm.hash);
      if (!["SHA-1", "SHA-256", "SHA-384", "SHA-512"].includes(hash)) throw notSupported(`hash ${hash}`);
      const b = bufferSource(keyData);
      const raw = b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
      const key = new CryptoKey({ name: "HMAC", hash: { name: hash }, length: raw.byteLength * 8 }, Boolean(extractable), [...usages]);
      keyBytes.set(key, raw);
      return key;
    },
    async sign(algorithm, key, data) {
      if (algorithmName(algorithm) !== "HMAC") throw notSupported(`sign with ${algorithmName(algorithm)}`);
      return hmac(key, data, "sign");
    },
    async verify(algorithm, key, signature, data) {
      if (algorithmName(algorithm) !== "HMAC") throw notSupported(`verify with ${algorithmName(algorithm)}`);
      const expected = new Uint8Array(hmac(key, data, "verify"));
      const given = bufferSource(signature);
      if (given.length !== expected.length) return false;
      let difference = 0; // every byte compared, whatever the first difference
      for (let i = 0; i < given.length; i++) difference |= given[i] ^ expected[i];
      return difference === 0;
    },
  };
  const crypto = {
    subtle,
    getRandomValues(array) {
      if (!ArrayBuffer.isView(array) || array instanceof Float32Array || array instanceof Float64Array || array instanceof DataView) {
        throw new DOMException("getRandomValues takes an integer typed array", "TypeMismatchError");
      }
      if (array.byteLength > 65536) throw new DOMException("at most 65,536 bytes at once", "QuotaExceededError");
      new Uint8Array(array.buffer, array.byteOffset, array.byteLength).set(new Uint8Array(__portico_random(array.byteLength)));
      return array;
    },
    randomUUID() {
      const b = new Uint8Array(__portico_random(16));
      b[6] = (b[6] & 0x0f) | 0x40;
      b[8] = (b[8] & 0x3f) | 0x80;
      const hex = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
      return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
    },
  };

  const show = (v) => {
    if (typeof v === "string") return v;
    if (v instanceof Error) return v.stack ? `${v.name}: ${v.message}\n${v.stack}` : `${v.name}: ${v.message}`;
    try { return JSON.stringify(v) ?? String(v); } catch { return String(v); }
  };
  const log = (level) => (...args) => __portico_log(level, args.map(show).join(" "));
  const console = { log: log("info"), info: log("info"), debug: log("debug"), warn: log("warn"), error: log("error") };

  for (const [name, value] of Object.entries({
    TextEncoder, TextDecoder, Headers, Request, Response, atob, btoa, console,
    crypto, CryptoKey,
    queueMicrotask: (f) => { Promise.resolve().then(f); },
  })) define(name, value);

  // Portico's side: a request in, a response out.
  // Portico's URL is absolute and already normalised: not parsed again.
  define("__portico_request", (method, url, pairs, body) =>
    new Request(url, { method, headers: pairs, body: method === "GET" || method === "HEAD" ? null : body, [TRUSTED]: true }));
  define("__portico_response", (value) => {
    if (!(value instanceof Response)) {
      throw new TypeError(`the handler returned ${value === undefined ? "nothing" : Object.prototype.toString.call(value)}, not a Response`);
    }
    const source = value.__source();
    if (typeof source === "string") return [value.status, value.headers.__pairs(), source];
    return [value.status, value.headers.__pairs(),
      source === null ? null : source.buffer.slice(source.byteOffset, source.byteOffset + source.byteLength)];
  });
})();
