// Web Crypto, as the W3C Web Cryptography API defines it, on `ring` (crypto.rs): crypto.getRandomValues and
// randomUUID, and crypto.subtle's digest, importKey, exportKey, generateKey, sign and verify for HMAC,
// RSASSA-PKCS1-v1_5, RSA-PSS, ECDSA (P-256, P-384) and Ed25519. What `ring` cannot do (encryption, key
// derivation, RSA key generation, P-521) is a NotSupportedError. A module evaluated the first time a handler
// touches `crypto`, `Crypto`, `SubtleCrypto` or `CryptoKey` (lazy.js), whose default export webapi.rs calls with
// the natives, which stay out of the handler's reach.
export default (native) => {
  const define = (name, value) =>
    Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });
  const isObject = (value) => value !== null && (typeof value === "object" || typeof value === "function");
  const webidl = (Class, name) => {
    const prototype = Class.prototype;
    for (const key of Object.getOwnPropertyNames(prototype)) {
      if (key !== "constructor") Object.defineProperty(prototype, key, { enumerable: true });
    }
    Object.defineProperty(prototype, Symbol.toStringTag, { value: name, configurable: true });
  };
  const required = (given, count, what) => {
    if (given < count) throw new TypeError(`${what}: ${count} argument${count > 1 ? "s" : ""} required, but only ${given} present`);
  };
  const error = (name, message) => new DOMException(message, name);
  // A native's failure meant as a DOMException ("DataError: ...") becomes one.
  const call = (f, ...args) => {
    try {
      return f(...args);
    } catch (e) {
      const named = e instanceof Error && /^([A-Za-z]+Error): ([^]*)$/.exec(e.message);
      if (named && named[1] !== "TypeError" && !(e instanceof TypeError)) throw error(named[1], named[2]);
      throw e;
    }
  };
  // A BufferSource's bytes as a Uint8Array. (The standard copies every input before the promise's work: here
  // the work is done, natively, before the method returns, so the input is read in place.)
  const bytesOf = (data, what) => {
    if (data instanceof ArrayBuffer) return new Uint8Array(data);
    if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    throw new TypeError(`${what}: expected an ArrayBuffer, a typed array or a DataView`);
  };
  const toBase64Url = (buffer) => {
    const bytes = new Uint8Array(buffer);
    let text = "";
    for (let i = 0; i < bytes.length; i += 4096) text += String.fromCharCode(...bytes.subarray(i, i + 4096));
    return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  };
  const fromBase64Url = (text, member) => {
    if (typeof text !== "string" || !/^[A-Za-z0-9_-]*$/.test(text) || text.length % 4 === 1) {
      throw error("DataError", `the JWK member ${member} is not base64url`);
    }
    const binary = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
    const out = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
    return out;
  };

  // ---- Algorithms ----

  const HASHES = ["SHA-1", "SHA-256", "SHA-384", "SHA-512"];
  // The algorithms each operation knows, by their registered names (matched without regard to case).
  const SIGNERS = ["HMAC", "RSASSA-PKCS1-v1_5", "RSA-PSS", "ECDSA", "Ed25519"];
  const OPERATIONS = {
    digest: HASHES,
    importKey: SIGNERS,
    generateKey: SIGNERS,
    sign: SIGNERS,
    verify: SIGNERS,
  };
  const KNOWN = [...SIGNERS, ...HASHES, "AES-CTR", "AES-CBC", "AES-GCM", "AES-KW", "RSA-OAEP", "ECDH", "X25519",
    "HKDF", "PBKDF2", "Ed448", "X448"];
  // "Normalize an algorithm": a string or an object with a name; [name, the object].
  const normalize = (algorithm, operation) => {
    const given = typeof algorithm === "string" ? algorithm : isObject(algorithm) ? algorithm.name : undefined;
    if (!isObject(algorithm) && typeof algorithm !== "string") {
      throw new TypeError(`${operation}: the algorithm is neither a string nor an object`);
    }
    if (given === undefined) throw new TypeError(`${operation}: the algorithm has no name`);
    const upper = `${given}`.toUpperCase();
    const name = KNOWN.find((n) => n.toUpperCase() === upper);
    if (name === undefined || !OPERATIONS[operation].includes(name)) {
      throw error("NotSupportedError", `${operation}: ${given} is not supported`);
    }
    return [name, typeof algorithm === "string" ? {} : algorithm];
  };
  const hashOf = (params, operation) => {
    if (params.hash === undefined) throw new TypeError(`${operation}: the algorithm has no hash`);
    return normalize(params.hash, "digest")[0];
  };
  const curveOf = (params, operation) => {
    if (params.namedCurve === undefined) throw new TypeError(`${operation}: the algorithm has no namedCurve`);
    const curve = `${params.namedCurve}`;
    if (curve !== "P-256" && curve !== "P-384") throw error("NotSupportedError", `${operation}: the curve ${curve} is not supported`);
    return curve;
  };
  // What crypto.rs calls each algorithm's keys.
  const KIND = { "RSASSA-PKCS1-v1_5": "rsa", "RSA-PSS": "rsa", ECDSA: "ec", Ed25519: "ed25519" };

  // ---- Keys ----

  const USAGES = ["encrypt", "decrypt", "sign", "verify", "deriveKey", "deriveBits", "wrapKey", "unwrapKey"];
  // The usages given, each a KeyUsage (a TypeError otherwise), in the standard's order without repeats.
  const usagesOf = (usages, what) => {
    if (!isObject(usages) || typeof usages[Symbol.iterator] !== "function") throw new TypeError(`${what}: the key usages are not a sequence`);
    const given = [...usages].map((u) => `${u}`);
    for (const u of given) if (!USAGES.includes(u)) throw new TypeError(`${what}: ${u} is not a key usage`);
    return USAGES.filter((u) => given.includes(u));
  };
  const allowOnly = (usages, allowed) => {
    for (const u of usages) if (!allowed.includes(u)) throw error("SyntaxError", `the key cannot be used to ${u}`);
  };

  const CONSTRUCTING = Symbol("constructing");
  const material = new WeakMap(); // CryptoKey -> its native key
  // CryptoKey -> as many bytes of the runtime's heap as `ring` keeps outside it for an RSA key (its primes,
  // exponents and Montgomery constants: about eight times the modulus), so that the heap limit counts them.
  const weight = new WeakMap();
  class CryptoKey {
    #type;
    #extractable;
    #algorithm;
    #usages;
    constructor(token, type, extractable, algorithm, usages) {
      if (token !== CONSTRUCTING) throw new TypeError("Illegal constructor");
      this.#type = type;
      this.#extractable = extractable;
      this.#algorithm = algorithm;
      this.#usages = usages;
    }
    get type() { return this.#type; }
    get extractable() { return this.#extractable; }
    get algorithm() { return this.#algorithm; }
    get usages() { return this.#usages; }
  }
  webidl(CryptoKey, "CryptoKey");

  // A CryptoKey around the native key, its algorithm as the standard describes it.
  const cryptoKey = (handle, name, params, extractable, usages) => {
    const [type, , detail, exponent] = native.describe(handle);
    let algorithm;
    if (name === "HMAC") algorithm = { name, hash: { name: params.hash }, length: params.length ?? detail };
    else if (name === "ECDSA") algorithm = { name, namedCurve: detail };
    else if (name === "Ed25519") algorithm = { name };
    else algorithm = { name, modulusLength: detail, publicExponent: new Uint8Array(exponent), hash: { name: params.hash } };
    const key = new CryptoKey(CONSTRUCTING, type, Boolean(extractable), algorithm, usages);
    material.set(key, handle);
    if (algorithm.modulusLength) weight.set(key, new ArrayBuffer(algorithm.modulusLength));
    return key;
  };
  const handleOf = (key, what) => {
    const handle = key instanceof CryptoKey ? material.get(key) : undefined;
    if (handle === undefined) throw new TypeError(`${what}: not a CryptoKey`);
    return handle;
  };

  // JWK checks common to every key type.
  const JWK_ALGORITHMS = {
    HMAC: { "SHA-1": "HS1", "SHA-256": "HS256", "SHA-384": "HS384", "SHA-512": "HS512" },
    "RSASSA-PKCS1-v1_5": { "SHA-1": "RS1", "SHA-256": "RS256", "SHA-384": "RS384", "SHA-512": "RS512" },
    "RSA-PSS": { "SHA-1": "PS1", "SHA-256": "PS256", "SHA-384": "PS384", "SHA-512": "PS512" },
    ECDSA: { "P-256": "ES256", "P-384": "ES384" },
  };
  const checkJwk = (jwk, kty, extractable, usages) => {
    if (jwk.kty !== kty) throw error("DataError", `the JWK's kty is not ${kty}`);
    if (usages.length > 0 && jwk.use !== undefined && jwk.use !== "sig") throw error("DataError", "the JWK's use is not sig");
    if (jwk.key_ops !== undefined) {
      if (!Array.isArray(jwk.key_ops)) throw error("DataError", "the JWK's key_ops is not a list");
      for (const u of usages) if (!jwk.key_ops.includes(u)) throw error("DataError", `the JWK's key_ops do not allow ${u}`);
    }
    if (jwk.ext === false && extractable) throw error("DataError", "the JWK is not extractable");
  };
  const member = (jwk, name) => {
    if (jwk[name] === undefined) throw error("DataError", `the JWK has no ${name}`);
    return fromBase64Url(jwk[name], name);
  };

  const importKey = (format, keyData, algorithm, extractable, usages) => {
    const what = "importKey";
    if (!["raw", "spki", "pkcs8", "jwk"].includes(format)) throw new TypeError(`${what}: ${format} is not a key format`);
    let data, jwk;
    if (format === "jwk") {
      if (!isObject(keyData)) throw new TypeError(`${what}: a JWK is an object`);
      jwk = keyData;
    } else {
      data = bytesOf(keyData, what);
    }
    const [name, given] = normalize(algorithm, what);
    usages = usagesOf(usages, what);
    const params = {};
    let handle;
    if (name === "HMAC") {
      params.hash = hashOf(given, what);
      allowOnly(usages, ["sign", "verify"]);
      if (format === "jwk") {
        checkJwk(jwk, "oct", extractable, usages);
        data = member(jwk, "k");
        if (jwk.alg !== undefined && jwk.alg !== JWK_ALGORITHMS.HMAC[params.hash]) {
          throw error("DataError", `the JWK's alg is not ${JWK_ALGORITHMS.HMAC[params.hash]}`);
        }
      } else if (format !== "raw") {
        throw error("NotSupportedError", `HMAC keys cannot be imported as ${format}`);
      }
      if (data.length === 0) throw error("DataError", "an HMAC key cannot be empty");
      if (given.length !== undefined) {
        const length = Number(given.length);
        if (!(length <= data.length * 8 && length > data.length * 8 - 8)) {
          throw error("DataError", `the key is not ${length} bits long`);
        }
        params.length = length;
      }
      handle = call(native.importSecret, params.hash, data);
    } else {
      const kind = KIND[name];
      let curve = "";
      if (kind === "rsa") params.hash = hashOf(given, what);
      if (kind === "ec") curve = curveOf(given, what);
      const isPrivate = format === "pkcs8" || (format === "jwk" && jwk.d !== undefined);
      allowOnly(usages, isPrivate ? ["sign"] : ["verify"]);
      if (format === "raw" && kind === "rsa") throw error("NotSupportedError", `${name} keys cannot be imported as raw`);
      if (format === "jwk") {
        checkJwk(jwk, kind === "rsa" ? "RSA" : kind === "ec" ? "EC" : "OKP", extractable, usages);
        let parts;
        if (kind === "rsa") {
          const expected = JWK_ALGORITHMS[name][params.hash];
          if (jwk.alg !== undefined && jwk.alg !== expected) throw error("DataError", `the JWK's alg is not ${expected}`);
          const names = isPrivate ? ["n", "e", "d", "p", "q", "dp", "dq", "qi"] : ["n", "e"];
          if (isPrivate && jwk.oth !== undefined) throw error("NotSupportedError", "RSA keys of more than two primes are not supported");
          parts = names.map((n) => member(jwk, n));
        } else if (kind === "ec") {
          if (jwk.crv !== curve) throw error("DataError", `the JWK's crv is not ${curve}`);
          if (jwk.alg !== undefined && jwk.alg !== JWK_ALGORITHMS.ECDSA[curve]) {
            throw error("DataError", `the JWK's alg is not ${JWK_ALGORITHMS.ECDSA[curve]}`);
          }
          parts = (isPrivate ? ["x", "y", "d"] : ["x", "y"]).map((n) => member(jwk, n));
        } else {
          if (jwk.crv !== "Ed25519") throw error("DataError", "the JWK's crv is not Ed25519");
          if (jwk.alg !== undefined && jwk.alg !== "EdDSA" && jwk.alg !== "Ed25519") throw error("DataError", "the JWK's alg is not EdDSA");
          parts = (isPrivate ? ["x", "d"] : ["x"]).map((n) => member(jwk, n));
        }
        handle = call(native.importJwk, kind, curve, parts);
      } else if (format === "pkcs8") {
        handle = call(native.importPrivate, kind, curve, data);
      } else {
        handle = call(native.importPublic, kind, curve, format, data);
      }
    }
    const key = cryptoKey(handle, name, params, extractable, usages);
    if (key.type !== "public" && usages.length === 0) throw error("SyntaxError", `a ${key.type} key needs a usage`);
    return key;
  };

  const exportKey = (format, key) => {
    const what = "exportKey";
    if (!["raw", "spki", "pkcs8", "jwk"].includes(format)) throw new TypeError(`${what}: ${format} is not a key format`);
    const handle = handleOf(key, what);
    if (!key.extractable) throw error("InvalidAccessError", "the key is not extractable");
    const { name } = key.algorithm;
    if ((format === "spki" || format === "raw") && key.type === "private") throw error("InvalidAccessError", `a private key cannot be exported as ${format}`);
    if (format === "pkcs8" && key.type !== "private") throw error("InvalidAccessError", "only a private key can be exported as pkcs8");
    if (format === "raw" && (name === "RSASSA-PKCS1-v1_5" || name === "RSA-PSS")) throw error("NotSupportedError", "RSA keys cannot be exported as raw");
    if (format === "spki" && name === "HMAC") throw error("NotSupportedError", "HMAC keys cannot be exported as spki");
    const exported = call(native.export, handle, format);
    if (format !== "jwk") return exported;
    const parts = exported.map(toBase64Url);
    let jwk;
    if (name === "HMAC") {
      jwk = { kty: "oct", k: parts[0], alg: JWK_ALGORITHMS.HMAC[key.algorithm.hash.name] };
    } else if (name === "ECDSA") {
      jwk = { kty: "EC", crv: key.algorithm.namedCurve, x: parts[0], y: parts[1] };
      if (parts.length > 2) jwk.d = parts[2];
    } else if (name === "Ed25519") {
      jwk = { kty: "OKP", crv: "Ed25519", x: parts[0] };
      if (parts.length > 1) jwk.d = parts[1];
    } else {
      jwk = { kty: "RSA", n: parts[0], e: parts[1] };
      ["d", "p", "q", "dp", "dq", "qi"].forEach((n, i) => { if (parts.length > 2) jwk[n] = parts[2 + i]; });
      jwk.alg = JWK_ALGORITHMS[name][key.algorithm.hash.name];
    }
    jwk.key_ops = [...key.usages];
    jwk.ext = key.extractable;
    return jwk;
  };

  const generateKey = (algorithm, extractable, usages) => {
    const what = "generateKey";
    const [name, given] = normalize(algorithm, what);
    usages = usagesOf(usages, what);
    if (name === "HMAC") {
      const hash = hashOf(given, what);
      allowOnly(usages, ["sign", "verify"]);
      if (usages.length === 0) throw error("SyntaxError", "a secret key needs a usage");
      const length = given.length === undefined ? (hash === "SHA-384" || hash === "SHA-512" ? 1024 : 512) : Number(given.length);
      if (!(length > 0) || length % 8 !== 0 || length > 65536 * 8) {
        throw error("OperationError", `HMAC keys of ${given.length} bits cannot be generated`);
      }
      const handle = call(native.importSecret, hash, new Uint8Array(call(native.random, length / 8)));
      return cryptoKey(handle, name, { hash }, extractable, usages);
    }
    if (name === "RSASSA-PKCS1-v1_5" || name === "RSA-PSS") throw error("NotSupportedError", "generating RSA keys is not supported");
    const curve = name === "ECDSA" ? curveOf(given, what) : "";
    allowOnly(usages, ["sign", "verify"]);
    const privateUsages = usages.filter((u) => u === "sign");
    if (privateUsages.length === 0) throw error("SyntaxError", "a private key needs the usage sign");
    const [privateHandle, publicHandle] = call(native.generate, KIND[name], curve);
    return {
      privateKey: cryptoKey(privateHandle, name, {}, extractable, privateUsages),
      publicKey: cryptoKey(publicHandle, name, {}, true, usages.filter((u) => u === "verify")),
    };
  };

  // What sign and verify give crypto.rs: [scheme, hash, salt length].
  const scheme = (name, given, key, operation) => {
    if (name !== key.algorithm.name) throw error("InvalidAccessError", `the key is a ${key.algorithm.name} key, not ${name}`);
    if (!key.usages.includes(operation)) throw error("InvalidAccessError", `the key cannot ${operation}`);
    switch (name) {
      case "HMAC": return ["hmac", "", 0];
      case "RSASSA-PKCS1-v1_5": return ["pkcs1", key.algorithm.hash.name, 0];
      case "RSA-PSS": {
        if (given.saltLength === undefined) throw new TypeError(`${operation}: RSA-PSS needs a saltLength`);
        return ["pss", key.algorithm.hash.name, Number(given.saltLength)];
      }
      case "ECDSA": return ["ecdsa", hashOf(given, operation), 0];
      default: return ["ed25519", "", 0];
    }
  };

  // ---- crypto.subtle ----

  // Every method gives a promise: what fails, synchronously or not, rejects it.
  const promised = (f) => function (...args) {
    try {
      return Promise.resolve(f(...args));
    } catch (e) {
      return Promise.reject(e);
    }
  };
  const unsupported = (operation) => promised(() => {
    throw error("NotSupportedError", `crypto.subtle.${operation} is not supported`);
  });
  class SubtleCrypto {
    constructor(token) {
      if (token !== CONSTRUCTING) throw new TypeError("Illegal constructor");
    }
  }
  const methods = {
    digest(algorithm, data) {
      required(arguments.length, 2, "Failed to execute 'digest' on 'SubtleCrypto'");
      const bytes = bytesOf(data, "digest");
      return call(native.digest, normalize(algorithm, "digest")[0], bytes);
    },
    importKey(format, keyData, algorithm, extractable, usages) {
      required(arguments.length, 5, "Failed to execute 'importKey' on 'SubtleCrypto'");
      return importKey(format, keyData, algorithm, extractable, usages);
    },
    exportKey(format, key) {
      required(arguments.length, 2, "Failed to execute 'exportKey' on 'SubtleCrypto'");
      return exportKey(format, key);
    },
    generateKey(algorithm, extractable, usages) {
      required(arguments.length, 3, "Failed to execute 'generateKey' on 'SubtleCrypto'");
      return generateKey(algorithm, extractable, usages);
    },
    sign(algorithm, key, data) {
      required(arguments.length, 3, "Failed to execute 'sign' on 'SubtleCrypto'");
      const [name, given] = normalize(algorithm, "sign");
      const bytes = bytesOf(data, "sign");
      const [kind, hash, salt] = scheme(name, given, key, "sign");
      return call(native.sign, handleOf(key, "sign"), kind, hash, salt, bytes);
    },
    verify(algorithm, key, signature, data) {
      required(arguments.length, 4, "Failed to execute 'verify' on 'SubtleCrypto'");
      const [name, given] = normalize(algorithm, "verify");
      const signed = bytesOf(signature, "verify");
      const bytes = bytesOf(data, "verify");
      const [kind, hash, salt] = scheme(name, given, key, "verify");
      return call(native.verify, handleOf(key, "verify"), kind, hash, salt, signed, bytes);
    },
  };
  for (const [name, f] of Object.entries(methods)) SubtleCrypto.prototype[name] = promised(f);
  for (const name of ["encrypt", "decrypt", "deriveBits", "deriveKey", "wrapKey", "unwrapKey"]) {
    SubtleCrypto.prototype[name] = unsupported(name);
  }
  webidl(SubtleCrypto, "SubtleCrypto");
  const subtle = new SubtleCrypto(CONSTRUCTING);

  // ---- crypto ----

  class Crypto {
    constructor(token) {
      if (token !== CONSTRUCTING) throw new TypeError("Illegal constructor");
    }
    get subtle() { return subtle; }
    getRandomValues(array) {
      required(arguments.length, 1, "Failed to execute 'getRandomValues' on 'Crypto'");
      if (!ArrayBuffer.isView(array) || array instanceof Float32Array || array instanceof Float64Array ||
        array instanceof DataView || (typeof Float16Array === "function" && array instanceof Float16Array)) {
        throw error("TypeMismatchError", "getRandomValues takes an integer typed array");
      }
      if (array.byteLength > 65536) throw error("QuotaExceededError", "at most 65,536 bytes at once");
      new Uint8Array(array.buffer, array.byteOffset, array.byteLength).set(new Uint8Array(native.random(array.byteLength)));
      return array;
    }
    randomUUID() {
      const b = new Uint8Array(native.random(16));
      b[6] = (b[6] & 0x0f) | 0x40;
      b[8] = (b[8] & 0x3f) | 0x80;
      const hex = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
      return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
    }
  }
  webidl(Crypto, "Crypto");

  define("crypto", new Crypto(CONSTRUCTING));
  define("Crypto", Crypto);
  define("SubtleCrypto", SubtleCrypto);
  define("CryptoKey", CryptoKey);
};
