// URL and URLSearchParams as the WHATWG URL Standard defines them. Parsing, the setters and the
// application/x-www-form-urlencoded parser and serializer are the `url` crate's (url.rs); the classes around
// them are here. A module evaluated once per runtime, whose default export webapi.rs calls with the natives,
// which stay out of the handler's reach.
//
// A URL keeps what the parser gave: its href and the offsets of its parts in it (`[href, afterScheme,
// beforeUsername, afterUsername, beforePassword, afterPassword, beforeHost, afterHost, beforePort, afterPort,
// beforePath, afterPath, afterQuery]`); the getters slice, a setter asks the native again, and searchParams is
// made on first use. The URL and its searchParams share that array, changed in place, rather than point at each
// other: no reference cycle, so a request's URL is freed when the request is done, not by the next collection.
export default (native) => {
  const { parse, set, formParse, formSerialize } = native;
  // WebIDL's USVString: a symbol is a TypeError, lone surrogates become U+FFFD.
  const usv = (value) => (typeof value === "string" ? value : `${value}`).toWellFormed();
  const required = (given, count, what) => {
    if (given < count) throw new TypeError(`${what}: ${count} argument${count > 1 ? "s" : ""} required, but only ${given} present`);
  };
  // Setters, as url.rs numbers them.
  const HREF = 0, PROTOCOL = 1, USERNAME = 2, PASSWORD = 3, HOST = 4, HOSTNAME = 5, PORT = 6, PATHNAME = 7,
    SEARCH = 8, HASH = 9;
  // Schemes whose origin is scheme://host[:port]; blob: has its inner URL's when that is http(s), and every
  // other URL an opaque origin ("null").
  const TUPLE_ORIGIN = new Set(["http:", "https:", "ws:", "wss:", "ftp:"]);
  // Internal constructor arguments: a URL from parts already parsed, searchParams linked to its URL.
  const PARSED = Symbol("parsed");
  const LINKED = Symbol("linked");
  const MISSING = Symbol("missing");

  // Set in URLSearchParams' static block: the URL's query changed, the list follows.
  let urlSearchChanged; // (params, search)
  const replace = (c, parts) => {
    for (let i = 0; i < parts.length; i++) c[i] = parts[i];
  };

  const searchOf = (c) => {
    const s = c[0].slice(c[11], c[12]);
    return s.length === 1 ? "" : s;
  };

  class URL {
    #c;
    #params = null;

    // (`MISSING` rather than `arguments.length`, whose object QuickJS would build on every call: a missing
    // `url` is told from an undefined one by the `base` that follows it.)
    constructor(url = MISSING, base = undefined) {
      if (url === PARSED) {
        this.#c = base;
        return;
      }
      if (url === MISSING) {
        if (base === undefined) throw new TypeError("Failed to construct 'URL': 1 argument required, but only 0 present");
        url = undefined;
      }
      url = usv(url);
      const c = base === undefined ? parse(url) : parse(url, usv(base));
      if (c === undefined) {
        throw new TypeError(base === undefined ? `Invalid URL: '${url}'` : `Invalid URL: '${url}' with base '${usv(base)}'`);
      }
      this.#c = c;
    }

    static parse(url, base = undefined) {
      required(arguments.length, 1, "Failed to execute 'parse' on 'URL'");
      url = usv(url);
      const c = base === undefined ? parse(url) : parse(url, usv(base));
      return c === undefined ? null : new URL(PARSED, c);
    }

    static canParse(url, base = undefined) {
      required(arguments.length, 1, "Failed to execute 'canParse' on 'URL'");
      url = usv(url);
      return (base === undefined ? parse(url) : parse(url, usv(base))) !== undefined;
    }

    #set(which, value) {
      const c = set(this.#c[0], which, usv(value));
      if (c === undefined) return false;
      replace(this.#c, c);
      if (this.#params !== null && (which === HREF || which === SEARCH)) urlSearchChanged(this.#params, searchOf(c));
      return true;
    }

    get href() { return this.#c[0]; }
    set href(value) {
      value = usv(value);
      if (!this.#set(HREF, value)) throw new TypeError(`Invalid URL: '${value}'`);
    }
    get origin() {
      const protocol = this.protocol;
      if (TUPLE_ORIGIN.has(protocol)) return protocol + "//" + this.host;
      if (protocol === "blob:") {
        const inner = URL.parse(this.pathname);
        if (inner !== null && (inner.protocol === "http:" || inner.protocol === "https:")) return inner.origin;
      }
      return "null";
    }
    get protocol() { return this.#c[0].slice(0, this.#c[1] + 1); }
    set protocol(value) { this.#set(PROTOCOL, value); }
    get username() { return this.#c[0].slice(this.#c[2], this.#c[3]); }
    set username(value) { this.#set(USERNAME, value); }
    get password() { return this.#c[0].slice(this.#c[4], this.#c[5]); }
    set password(value) { this.#set(PASSWORD, value); }
    get host() { return this.#c[0].slice(this.#c[6], this.#c[9]); }
    set host(value) { this.#set(HOST, value); }
    get hostname() { return this.#c[0].slice(this.#c[6], this.#c[7]); }
    set hostname(value) { this.#set(HOSTNAME, value); }
    get port() { return this.#c[0].slice(this.#c[8], this.#c[9]); }
    set port(value) { this.#set(PORT, value); }
    get pathname() { return this.#c[0].slice(this.#c[10], this.#c[11]); }
    set pathname(value) { this.#set(PATHNAME, value); }
    get search() { return searchOf(this.#c); }
    set search(value) { this.#set(SEARCH, value); }
    get searchParams() { return (this.#params ??= new URLSearchParams(LINKED, this.#c)); }
    get hash() {
      const s = this.#c[0].slice(this.#c[12]);
      return s.length === 1 ? "" : s;
    }
    set hash(value) { this.#set(HASH, value); }
    toString() { return this.#c[0]; }
    toJSON() { return this.#c[0]; }
  }

  class URLSearchParams {
    // name, value, name, value, ...
    #list;
    // The parts of the URL whose query this is (shared with it), or null.
    #url;

    constructor(init = undefined, parts = undefined) {
      if (init === LINKED) {
        this.#url = parts;
        const search = searchOf(parts);
        this.#list = search === "" ? [] : formParse(search.slice(1));
        return;
      }
      this.#list = [];
      this.#url = null;
      if (init === undefined || init === null) return;
      if (typeof init === "object" || typeof init === "function") {
        const iterator = init[Symbol.iterator];
        if (iterator !== undefined && iterator !== null) {
          if (typeof iterator !== "function") throw new TypeError("Failed to construct 'URLSearchParams': the init's @@iterator is not a function");
          for (const pair of init) {
            if (pair === null || (typeof pair !== "object" && typeof pair !== "function")) {
              throw new TypeError("Failed to construct 'URLSearchParams': each pair must be a sequence");
            }
            const items = [...pair];
            if (items.length !== 2) {
              throw new TypeError("Failed to construct 'URLSearchParams': each pair must have exactly two items, a name and a value");
            }
            this.#list.push(usv(items[0]), usv(items[1]));
          }
        } else {
          // A record: own enumerable keys, in order; a key seen twice (after USVString conversion) keeps its
          // first place and takes its last value.
          const at = new Map();
          for (const key of Reflect.ownKeys(init)) {
            const descriptor = Reflect.getOwnPropertyDescriptor(init, key);
            if (descriptor === undefined || !descriptor.enumerable) continue;
            const name = usv(key), value = usv(init[key]);
            const i = at.get(name);
            if (i === undefined) {
              at.set(name, this.#list.length);
              this.#list.push(name, value);
            } else this.#list[i + 1] = value;
          }
        }
        return;
      }
      let text = usv(init);
      if (text.charCodeAt(0) === 0x3f) text = text.slice(1);
      if (text !== "") this.#list = formParse(text);
    }

    #update() {
      if (this.#url === null) return;
      const c = set(this.#url[0], SEARCH, this.toString());
      if (c !== undefined) replace(this.#url, c);
    }

    get size() { return this.#list.length >> 1; }

    append(name, value) {
      required(arguments.length, 2, "Failed to execute 'append' on 'URLSearchParams'");
      this.#list.push(usv(name), usv(value));
      this.#update();
    }

    delete(name, value = undefined) {
      required(arguments.length, 1, "Failed to execute 'delete' on 'URLSearchParams'");
      name = usv(name);
      if (value !== undefined) value = usv(value);
      const list = this.#list, kept = [];
      for (let i = 0; i < list.length; i += 2) {
        if (list[i] !== name || (value !== undefined && list[i + 1] !== value)) kept.push(list[i], list[i + 1]);
      }
      this.#list = kept;
      this.#update();
    }

    get(name) {
      required(arguments.length, 1, "Failed to execute 'get' on 'URLSearchParams'");
      name = usv(name);
      const list = this.#list;
      for (let i = 0; i < list.length; i += 2) if (list[i] === name) return list[i + 1];
      return null;
    }

    getAll(name) {
      required(arguments.length, 1, "Failed to execute 'getAll' on 'URLSearchParams'");
      name = usv(name);
      const list = this.#list, values = [];
      for (let i = 0; i < list.length; i += 2) if (list[i] === name) values.push(list[i + 1]);
      return values;
    }

    has(name, value = undefined) {
      required(arguments.length, 1, "Failed to execute 'has' on 'URLSearchParams'");
      name = usv(name);
      if (value !== undefined) value = usv(value);
      const list = this.#list;
      for (let i = 0; i < list.length; i += 2) {
        if (list[i] === name && (value === undefined || list[i + 1] === value)) return true;
      }
      return false;
    }

    set(name, value) {
      required(arguments.length, 2, "Failed to execute 'set' on 'URLSearchParams'");
      name = usv(name);
      value = usv(value);
      const list = this.#list, out = [];
      let found = false;
      for (let i = 0; i < list.length; i += 2) {
        if (list[i] !== name) out.push(list[i], list[i + 1]);
        else if (!found) {
          found = true;
          out.push(name, value);
        }
      }
      if (!found) out.push(name, value);
      this.#list = out;
      this.#update();
    }

    // Stable, by the names' UTF-16 code units (what `<` compares on strings).
    sort() {
      const list = this.#list, pairs = [];
      for (let i = 0; i < list.length; i += 2) pairs.push([list[i], list[i + 1], i]);
      pairs.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[2] - b[2]));
      const sorted = [];
      for (const [name, value] of pairs) sorted.push(name, value);
      this.#list = sorted;
      this.#update();
    }

    forEach(callback, thisArg = undefined) {
      required(arguments.length, 1, "Failed to execute 'forEach' on 'URLSearchParams'");
      if (typeof callback !== "function") throw new TypeError("Failed to execute 'forEach' on 'URLSearchParams': the callback is not a function");
      for (let i = 0; i < this.#list.length; i += 2) callback.call(thisArg, this.#list[i + 1], this.#list[i], this);
    }

    // Live, as the standard's iterators are: each step reads the list as it is then.
    *entries() { for (let i = 0; i < this.#list.length; i += 2) yield [this.#list[i], this.#list[i + 1]]; }
    *keys() { for (let i = 0; i < this.#list.length; i += 2) yield this.#list[i]; }
    *values() { for (let i = 0; i < this.#list.length; i += 2) yield this.#list[i + 1]; }

    toString() { return this.#list.length === 0 ? "" : formSerialize(this.#list); }

    static {
      urlSearchChanged = (params, search) => {
        params.#list = search === "" ? [] : formParse(search.slice(1));
      };
    }
  }

  // As WebIDL lays out an interface: members enumerable, @@iterator the same function as entries, a
  // @@toStringTag; the globals writable, configurable and not enumerable.
  const webidl = (Class, name) => {
    const prototype = Class.prototype;
    for (const key of Object.getOwnPropertyNames(prototype)) {
      if (key !== "constructor") Object.defineProperty(prototype, key, { enumerable: true });
    }
    for (const key of Object.getOwnPropertyNames(Class)) {
      if (!["length", "name", "prototype"].includes(key)) Object.defineProperty(Class, key, { enumerable: true });
    }
    Object.defineProperty(prototype, Symbol.toStringTag, { value: name, configurable: true });
    Object.defineProperty(globalThis, name, { value: Class, writable: true, configurable: true, enumerable: false });
  };
  // (`constructor(url = MISSING, ...)` made it 0; WebIDL says 1, the required arguments.)
  Object.defineProperty(URL, "length", { value: 1, configurable: true });
  webidl(URL, "URL");
  webidl(URLSearchParams, "URLSearchParams");
  Object.defineProperty(URLSearchParams.prototype, Symbol.iterator, {
    value: URLSearchParams.prototype.entries, writable: true, configurable: true,
  });
};
