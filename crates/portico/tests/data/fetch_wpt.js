// The Fetch Standard's Headers, Request and Response in functions: the handler of tests/functions_fetch_wpt.rs,
// run by Portico and by Deno (`deno serve`).
//
// GET /wpt: web-platform-tests' cases of fetch/api/headers, fetch/api/request and fetch/api/response that need
// no browser and no server, and of FileAPI/blob's Blob-text, Blob-array-buffer, Blob-bytes and Blob-slice (the
// Blob that bodies are read as), ported to a small testharness of this file (`test`, `promise_test`, `assert_*`) and
// run one after the other; answers { total, names, failures: [{ name, error }] }. Each case is named
// "FILE :: NAME" after the web-platform-tests file and case it comes from.
//
// How the port differs from the originals:
// - A page's URL is a browser's: relative URLs ("", "...", "/") are resolved here against BASE first.
// - Cases that fetch from web-platform-tests' server (`fetch("../resources/...")`) are left out; so are the
//   XMLHttpRequest ones. header-values and header-values-normalize check the values on a Headers instead of
//   sending them.
// - request-disturbed disturbs its requests with text() where the original calls blob() only to disturb them.
// - json.any.js reads its text with a BOM from a Response made of it instead of from a data: URL.

const BASE = "https://wpt.example/fetch/api/request/page.html";
const rel = (url) => new URL(url, BASE).href;

// --- The testharness -------------------------------------------------------------------------------------------

const cases = [];
let file = "";
const names = new Set();
// (A name's lone surrogates are written as escapes: the names travel as JSON.)
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;
function register(fn, name, async) {
  const full = `${file} :: ${name}`.replace(LONE_SURROGATE, (c) => `\\u${c.charCodeAt(0).toString(16)}`);
  if (names.has(full)) throw new Error(`two cases named ${full}`);
  names.add(full);
  cases.push({ name: full, fn, async });
}
const test = (fn, name) => register(fn, name, false);
const promise_test = (fn, name) => register(fn, name, true);

class AssertionError extends Error {
  name = "AssertionError";
}
const show = (v) => {
  if (typeof v === "string") return JSON.stringify(v);
  if (typeof v === "symbol") return v.toString();
  if (Array.isArray(v)) return `[${v.map(show).join(", ")}]`;
  try {
    return String(v);
  } catch {
    return Object.prototype.toString.call(v);
  }
};
const fail = (what, message) => {
  throw new AssertionError(`${what}${message ? ` (${message})` : ""}`);
};
function assert_equals(actual, expected, message) {
  if (!Object.is(actual, expected)) fail(`expected ${show(expected)} but got ${show(actual)}`, message);
}
function assert_not_equals(actual, expected, message) {
  if (Object.is(actual, expected)) fail(`got disallowed value ${show(actual)}`, message);
}
function assert_true(actual, message) {
  if (actual !== true) fail(`expected true got ${show(actual)}`, message);
}
function assert_false(actual, message) {
  if (actual !== false) fail(`expected false got ${show(actual)}`, message);
}
function assert_array_equals(actual, expected, message) {
  if (actual === null || actual === undefined || typeof actual.length !== "number") {
    fail(`expected an array, got ${show(actual)}`, message);
  }
  if (actual.length !== expected.length) {
    fail(`lengths differ, expected ${show([...expected])} length ${expected.length}, got ${show([...actual])} length ${actual.length}`, message);
  }
  for (let i = 0; i < expected.length; i++) {
    if (!Object.is(actual[i], expected[i])) fail(`expected ${show(expected[i])} but got ${show(actual[i])} at index ${i}`, message);
  }
}
function assert_throws_js(Type, fn, message) {
  try {
    fn();
  } catch (e) {
    if (e instanceof AssertionError) throw e;
    if (!(e instanceof Type) || e.constructor !== Type) fail(`threw ${show(e)}, not a ${Type.name}`, message);
    return;
  }
  fail(`did not throw a ${Type.name}`, message);
}
function assert_unreached(message) {
  fail("reached unreachable code", message);
}
async function promise_rejects_js(t, Type, promise, message) {
  try {
    await promise;
  } catch (e) {
    if (!(e instanceof Type) || e.constructor !== Type) fail(`rejected with ${show(e)}, not a ${Type.name}`, message);
    return;
  }
  fail(`did not reject with a ${Type.name}`, message);
}
async function promise_rejects_exactly(t, error, promise, message) {
  try {
    await promise;
  } catch (e) {
    if (e !== error) fail(`rejected with ${show(e)}, not the expected error`, message);
    return;
  }
  fail("did not reject", message);
}

const LIMIT_MS = 2000;
async function runAll() {
  const failures = [];
  for (const c of cases) {
    const cleanups = [];
    const t = { add_cleanup: (f) => cleanups.push(f) };
    let timer;
    try {
      const out = c.fn.call(t, t);
      if (c.async) {
        await Promise.race([
          Promise.resolve(out),
          new Promise((_, reject) => { timer = setTimeout(() => reject(new Error("timed out")), LIMIT_MS); }),
        ]);
      }
    } catch (e) {
      let error;
      try {
        error = e instanceof Error ? `${e.name}: ${e.message}` : `threw ${show(e)}`;
      } catch {
        error = "threw something";
      }
      failures.push({ name: c.name, error });
    } finally {
      clearTimeout(timer);
      for (const f of cleanups) f();
    }
  }
  return { total: cases.length, names: cases.map((c) => c.name), failures };
}

// Helpers of fetch/api/resources/utils.js, rewritten.
function checkRequest(request, expected) {
  for (const attribute in expected) {
    if (attribute === "headers") {
      for (const key in expected.headers.keys()) {
        assert_equals(request.headers.get(key), expected.headers.get(key), `header ${key}`);
      }
    } else if (attribute === "body") {
      assert_true(request.headers.has("Content-Type"), "a body gives a Content-Type");
    } else if (["method", "referrer", "referrerPolicy", "credentials", "cache", "redirect", "integrity", "url",
      "destination"].includes(attribute)) {
      assert_equals(request[attribute], expected[attribute], `attribute ${attribute}`);
    }
  }
}
const stringToArray = (str) => Uint8Array.from(str, (c) => c.charCodeAt(0));
function validateBufferFromString(buffer, expected, message) {
  assert_array_equals(new Uint8Array(buffer !== undefined ? buffer : []), stringToArray(expected), message);
}
async function validateStreamFromString(reader, expected) {
  let bytes = new Uint8Array(0);
  for (;;) {
    const { done, value } = await reader.read(new Uint8Array(64));
    if (done) break;
    assert_true(value instanceof Uint8Array, "chunks are Uint8Arrays");
    const joined = new Uint8Array(bytes.length + value.length);
    joined.set(bytes);
    joined.set(value, bytes.length);
    bytes = joined;
  }
  validateBufferFromString(bytes, expected, "the stream's bytes");
}

// Every case is made anew for each run: a run consumes bodies that module-level state would keep.
function defineCases() {
// --- fetch/api/headers -----------------------------------------------------------------------------------------

file = "headers-basic.any.js";
test(() => { new Headers(); }, "Create headers from no parameter");
test(() => { new Headers(undefined); }, "Create headers from undefined parameter");
test(() => { new Headers({}); }, "Create headers from empty object");
for (const parameter of [null, 1]) {
  test(() => { assert_throws_js(TypeError, () => new Headers(parameter)); }, `Create headers with ${parameter} should throw`);
}
const basicDict = { name1: "value1", name2: "value2", name3: "value3", name4: null, name5: undefined, name6: 1,
  "Content-Type": "value4" };
const basicSeq = Object.keys(basicDict).map((name) => [name, basicDict[name]]);
test(() => {
  const headers = new Headers(basicSeq);
  for (const name in basicDict) assert_equals(headers.get(name), String(basicDict[name]), name);
  assert_equals(headers.get("length"), null, "a sequence, not a record");
}, "Create headers with sequence");
test(() => {
  const headers = new Headers(basicDict);
  for (const name in basicDict) assert_equals(headers.get(name), String(basicDict[name]), name);
}, "Create headers with record");
test(() => {
  const headers = new Headers(new Headers(basicDict));
  for (const name in basicDict) assert_equals(headers.get(name), String(basicDict[name]), name);
}, "Create headers with existing headers");
test(() => {
  const headers = new Headers();
  headers[Symbol.iterator] = function* () { yield ["test", "test"]; };
  assert_equals(new Headers(headers).get("test"), "test");
}, "Create headers with existing headers with custom iterator");
test(() => {
  const headers = new Headers();
  for (const name in basicDict) {
    headers.append(name, basicDict[name]);
    assert_equals(headers.get(name), String(basicDict[name]), name);
  }
}, "Check append method");
test(() => {
  const headers = new Headers();
  for (const name in basicDict) {
    headers.set(name, basicDict[name]);
    assert_equals(headers.get(name), String(basicDict[name]), name);
  }
}, "Check set method");
test(() => {
  const headers = new Headers(basicDict);
  for (const name in basicDict) assert_true(headers.has(name), name);
  assert_false(headers.has("nameNotInHeaders"));
}, "Check has method");
test(() => {
  const headers = new Headers(basicDict);
  for (const name in basicDict) {
    assert_true(headers.has(name), name);
    headers.delete(name);
    assert_true(!headers.has(name), name);
  }
}, "Check delete method");
test(() => {
  const headers = new Headers(basicDict);
  for (const name in basicDict) assert_equals(headers.get(name), String(basicDict[name]), name);
  assert_equals(headers.get("nameNotInHeaders"), null);
}, "Check get method");
const entriesDict = { name1: "value1", Name2: "value2", name: "value3", "content-Type": "value4", "Content-Typ": "value5",
  "Content-Types": "value6" };
const sortedDict = {};
const entryValues = [];
const sortedKeys = Object.keys(entriesDict).map((k) => {
  sortedDict[k.toLowerCase()] = entriesDict[k];
  entryValues.push(entriesDict[k]);
  return k.toLowerCase();
}).sort();
const iteratorPrototype = Object.getPrototypeOf(Object.getPrototypeOf([][Symbol.iterator]()));
function checkIteratorProperties(iterator) {
  const prototype = Object.getPrototypeOf(iterator);
  assert_equals(Object.getPrototypeOf(prototype), iteratorPrototype, "%IteratorPrototype%");
  const next = Object.getOwnPropertyDescriptor(prototype, "next");
  assert_true(next.configurable, "configurable");
  assert_true(next.enumerable, "enumerable");
  assert_true(next.writable, "writable");
}
test(() => {
  const headers = new Headers(entriesDict);
  const it = headers.keys();
  checkIteratorProperties(it);
  for (const key of sortedKeys) {
    const entry = it.next();
    assert_false(entry.done);
    assert_equals(entry.value, key);
  }
  assert_true(it.next().done);
  assert_true(it.next().done);
  for (const key of headers.keys()) assert_true(sortedKeys.includes(key));
}, "Check keys method");
test(() => {
  const headers = new Headers(entriesDict);
  const it = headers.values();
  checkIteratorProperties(it);
  for (const key of sortedKeys) {
    const entry = it.next();
    assert_false(entry.done);
    assert_equals(entry.value, sortedDict[key]);
  }
  assert_true(it.next().done);
  assert_true(it.next().done);
  for (const value of headers.values()) assert_true(entryValues.includes(value));
}, "Check values method");
test(() => {
  const headers = new Headers(entriesDict);
  const it = headers.entries();
  checkIteratorProperties(it);
  for (const key of sortedKeys) {
    const entry = it.next();
    assert_false(entry.done);
    assert_equals(entry.value[0], key);
    assert_equals(entry.value[1], sortedDict[key]);
  }
  assert_true(it.next().done);
  assert_true(it.next().done);
  for (const entry of headers.entries()) assert_equals(entry[1], sortedDict[entry[0]]);
}, "Check entries method");
test(() => {
  const it = new Headers(entriesDict)[Symbol.iterator]();
  for (const key of sortedKeys) {
    const entry = it.next();
    assert_false(entry.done);
    assert_equals(entry.value[0], key);
    assert_equals(entry.value[1], sortedDict[key]);
  }
  assert_true(it.next().done);
  assert_true(it.next().done);
}, "Check Symbol.iterator method");
test(() => {
  const headers = new Headers(entriesDict);
  const reference = sortedKeys[Symbol.iterator]();
  headers.forEach((value, key, container) => {
    assert_equals(headers, container);
    const entry = reference.next();
    assert_false(entry.done);
    assert_equals(key, entry.value);
    assert_equals(value, sortedDict[entry.value]);
  });
  assert_true(reference.next().done);
}, "Check forEach method");
const iterate = (init, during) => {
  const headers = new Headers(init);
  const keys = [], values = [];
  for (const [name, value] of headers) {
    keys.push(name);
    values.push(value);
    during(headers, name);
  }
  return [keys, values];
};
test(() => {
  const [keys, values] = iterate({ foo: "2", baz: "1", BAR: "0" }, (h) => h.delete("foo"));
  assert_array_equals(keys, ["bar", "baz"]);
  assert_array_equals(values, ["0", "1"]);
}, "Iteration skips elements removed while iterating");
test(() => {
  const [keys, values] = iterate({ foo: "2", baz: "1", BAR: "0", quux: "3" }, (h, n) => n === "baz" && h.delete("bar"));
  assert_array_equals(keys, ["bar", "baz", "quux"]);
  assert_array_equals(values, ["0", "1", "3"]);
}, "Removing elements already iterated over causes an element to be skipped during iteration");
test(() => {
  const [keys, values] = iterate({ foo: "2", baz: "1", BAR: "0", quux: "3" }, (h, n) => n === "baz" && h.append("X-yZ", "4"));
  assert_array_equals(keys, ["bar", "baz", "foo", "quux", "x-yz"]);
  assert_array_equals(values, ["0", "1", "2", "3", "4"]);
}, "Appending a value pair during iteration causes it to be reached during iteration");
test(() => {
  const [keys, values] = iterate({ foo: "2", baz: "1", BAR: "0", quux: "3" }, (h, n) => n === "baz" && h.append("abc", "-1"));
  assert_array_equals(keys, ["bar", "baz", "baz", "foo", "quux"]);
  assert_array_equals(values, ["0", "1", "1", "2", "3"]);
}, "Prepending a value pair before the current element position causes it to be skipped during iteration and adds the current element a second time");

file = "header-setcookie.any.js";
const cookieList = [["set-cookie", "foo=bar"], ["Set-Cookie", "fizz=buzz; domain=example.com"]];
const cookie2List = [["set-cookie2", "foo2=bar2"], ["Set-Cookie2", "fizz2=buzz2; domain=example2.com"]];
function assert_nested_array_equals(actual, expected) {
  assert_equals(actual.length, expected.length, "lengths");
  for (let i = 0; i < expected.length; i++) assert_array_equals(actual[i], expected[i]);
}
test(() => {
  assert_equals(new Headers(cookieList).get("set-cookie"), "foo=bar, fizz=buzz; domain=example.com");
}, "Headers.prototype.get combines set-cookie headers in order");
test(() => {
  assert_nested_array_equals([...new Headers(cookieList)],
    [["set-cookie", "foo=bar"], ["set-cookie", "fizz=buzz; domain=example.com"]]);
}, "Headers iterator does not combine set-cookie headers");
test(() => {
  assert_nested_array_equals([...new Headers(cookie2List)],
    [["set-cookie2", "foo2=bar2, fizz2=buzz2; domain=example2.com"]]);
}, "Headers iterator does not special case set-cookie2 headers");
test(() => {
  assert_nested_array_equals([...new Headers([...cookieList, ...cookie2List])], [
    ["set-cookie", "foo=bar"], ["set-cookie", "fizz=buzz; domain=example.com"],
    ["set-cookie2", "foo2=bar2, fizz2=buzz2; domain=example2.com"]]);
}, "Headers iterator does not combine set-cookie & set-cookie2 headers");
test(() => {
  const list = [["set-cookie", "z=z"], ["set-cookie", "a=a"], ["set-cookie", "n=n"]];
  assert_nested_array_equals([...new Headers(list)], list);
}, "Headers iterator preserves set-cookie ordering");
test(() => {
  const headers = new Headers([["xylophone-header", "1"], ["best-header", "2"], ["set-cookie", "3"],
    ["a-cool-header", "4"], ["set-cookie", "5"], ["a-cool-header", "6"], ["best-header", "7"]]);
  assert_nested_array_equals([...headers], [["a-cool-header", "4, 6"], ["best-header", "2, 7"], ["set-cookie", "3"],
    ["set-cookie", "5"], ["xylophone-header", "1"]]);
}, "Headers iterator preserves per header ordering, but sorts keys alphabetically");
test(() => {
  const headers = new Headers([["xylophone-header", "7"], ["best-header", "6"], ["set-cookie", "5"],
    ["a-cool-header", "4"], ["set-cookie", "3"], ["a-cool-header", "2"], ["best-header", "1"]]);
  assert_nested_array_equals([...headers], [["a-cool-header", "4, 2"], ["best-header", "6, 1"], ["set-cookie", "5"],
    ["set-cookie", "3"], ["xylophone-header", "7"]]);
}, "Headers iterator preserves per header ordering, but sorts keys alphabetically (and ignores value ordering)");
test(() => {
  const headers = new Headers([["fizz", "buzz"], ["X-Header", "test"]]);
  const it = headers[Symbol.iterator]();
  assert_array_equals(it.next().value, ["fizz", "buzz"]);
  headers.append("Set-Cookie", "a=b");
  assert_array_equals(it.next().value, ["set-cookie", "a=b"]);
  headers.append("Accept", "text/html");
  assert_array_equals(it.next().value, ["set-cookie", "a=b"]);
  assert_array_equals(it.next().value, ["x-header", "test"]);
  headers.append("set-cookie", "c=d");
  assert_array_equals(it.next().value, ["x-header", "test"]);
  assert_true(it.next().done);
}, "Headers iterator is correctly updated with set-cookie changes");
test(() => {
  const headers = new Headers([["set-cookie", "a"], ["set-cookie", "b"], ["set-cookie", "c"]]);
  const it = headers[Symbol.iterator]();
  assert_array_equals(it.next().value, ["set-cookie", "a"]);
  headers.delete("set-cookie");
  headers.append("set-cookie", "d");
  headers.append("set-cookie", "e");
  headers.append("set-cookie", "f");
  assert_array_equals(it.next().value, ["set-cookie", "e"]);
  assert_array_equals(it.next().value, ["set-cookie", "f"]);
  assert_true(it.next().done);
}, "Headers iterator is correctly updated with set-cookie changes #2");
test(() => { assert_true(new Headers(cookieList).has("sEt-cOoKiE")); }, "Headers.prototype.has works for set-cookie");
test(() => {
  const headers = new Headers(cookie2List);
  headers.append("set-Cookie", "foo=bar");
  headers.append("sEt-cOoKiE", "fizz=buzz");
  assert_nested_array_equals([...headers], [["set-cookie", "foo=bar"], ["set-cookie", "fizz=buzz"],
    ["set-cookie2", "foo2=bar2, fizz2=buzz2; domain=example2.com"]]);
}, "Headers.prototype.append works for set-cookie");
test(() => {
  const headers = new Headers(cookieList);
  headers.set("set-cookie", "foo2=bar2");
  assert_nested_array_equals([...headers], [["set-cookie", "foo2=bar2"]]);
}, "Headers.prototype.set works for set-cookie");
test(() => {
  const headers = new Headers(cookieList);
  headers.delete("set-Cookie");
  assert_nested_array_equals([...headers], []);
}, "Headers.prototype.delete works for set-cookie");
test(() => { assert_array_equals(new Headers().getSetCookie(), []); }, "Headers.prototype.getSetCookie with no headers present");
test(() => {
  assert_array_equals(new Headers([cookieList[0]]).getSetCookie(), ["foo=bar"]);
}, "Headers.prototype.getSetCookie with one header");
test(() => {
  assert_array_equals(new Headers({ "Set-Cookie": "foo=bar" }).getSetCookie(), ["foo=bar"]);
}, "Headers.prototype.getSetCookie with one header created from an object");
test(() => {
  assert_array_equals(new Headers(cookieList).getSetCookie(), ["foo=bar", "fizz=buzz; domain=example.com"]);
}, "Headers.prototype.getSetCookie with multiple headers");
test(() => {
  assert_array_equals(new Headers([["set-cookie", ""]]).getSetCookie(), [""]);
}, "Headers.prototype.getSetCookie with an empty header");
test(() => {
  assert_array_equals(new Headers([["set-cookie", "x"], ["set-cookie", "x"]]).getSetCookie(), ["x", "x"]);
}, "Headers.prototype.getSetCookie with two equal headers");
test(() => {
  const headers = new Headers([["set-cookie2", "x"], ["set-cookie", "y"], ["set-cookie2", "z"]]);
  assert_array_equals(headers.getSetCookie(), ["y"]);
}, "Headers.prototype.getSetCookie ignores set-cookie2 headers");
test(() => {
  const headers = new Headers([["set-cookie", "z=z"], ["set-cookie", "a=a"], ["set-cookie", "n=n"]]);
  assert_array_equals(headers.getSetCookie(), ["z=z", "a=a", "n=n"]);
}, "Headers.prototype.getSetCookie preserves header ordering");
test(() => {
  const headers = new Headers({ "Set-Cookie": "  a=b\n" });
  headers.append("set-cookie", "\n\rc=d  ");
  assert_nested_array_equals([...headers], [["set-cookie", "a=b"], ["set-cookie", "c=d"]]);
  headers.set("set-cookie", "\te=f ");
  assert_nested_array_equals([...headers], [["set-cookie", "e=f"]]);
}, "Adding Set-Cookie headers normalizes their value");
test(() => {
  assert_throws_js(TypeError, () => new Headers({ "set-cookie": "\0" }));
  const headers = new Headers();
  assert_throws_js(TypeError, () => headers.append("Set-Cookie", "a\nb"));
  assert_throws_js(TypeError, () => headers.set("Set-Cookie", "a\rb"));
}, "Adding invalid Set-Cookie headers throws");
test(() => {
  const response = new Response();
  response.headers.append("Set-Cookie", "foo=bar");
  assert_array_equals(response.headers.getSetCookie(), []);
  response.headers.append("sEt-cOokIe", "bar=baz");
  assert_array_equals(response.headers.getSetCookie(), []);
}, "Set-Cookie is a forbidden response header");

file = "headers-casing.any.js";
const caseDict = { UPPERCASE: "value1", lowercase: "value2", mixedCase: "value3", "Content-TYPE": "value4" };
function checkHeadersCase(name, headers) {
  for (const n of [name, name.toLowerCase(), name.toUpperCase()]) assert_equals(headers.get(n), caseDict[name], n);
}
test(() => {
  const headers = new Headers(caseDict);
  for (const name in caseDict) checkHeadersCase(name, headers);
}, "Create headers, names use characters with different case");
test(() => {
  const headers = new Headers();
  for (const name in caseDict) {
    headers.append(name, caseDict[name]);
    checkHeadersCase(name, headers);
  }
}, "Check append method, names use characters with different case");
test(() => {
  const headers = new Headers();
  for (const name in caseDict) {
    headers.set(name, caseDict[name]);
    checkHeadersCase(name, headers);
  }
}, "Check set method, names use characters with different case");
test(() => {
  const headers = new Headers();
  for (const name in caseDict) headers.set(name, caseDict[name]);
  for (const name in caseDict) headers.delete(name.toLowerCase());
  for (const name in caseDict) assert_false(headers.has(name), name);
}, "Check delete method, names use characters with different case");

file = "headers-combine.any.js";
const combineSeq = [["single", "singleValue"], ["double", "doubleValue1"], ["double", "doubleValue2"],
  ["triple", "tripleValue1"], ["triple", "tripleValue2"], ["triple", "tripleValue3"]];
const combined = { single: "singleValue", double: "doubleValue1, doubleValue2",
  triple: "tripleValue1, tripleValue2, tripleValue3" };
test(() => {
  const headers = new Headers(combineSeq);
  for (const name in combined) assert_equals(headers.get(name), combined[name]);
}, "Create headers using same name for different values");
test(() => {
  const headers = new Headers(combineSeq);
  for (const name in combined) {
    assert_true(headers.has(name), name);
    headers.delete(name);
    assert_false(headers.has(name), name);
  }
}, "Check delete and has methods when using same name for different values");
test(() => {
  const headers = new Headers(combineSeq);
  for (const name in combined) {
    headers.set(name, "newSingleValue");
    assert_equals(headers.get(name), "newSingleValue", name);
  }
}, "Check set methods when called with already used name");
test(() => {
  const headers = new Headers(combineSeq);
  for (const name in combined) {
    const value = headers.get(name);
    headers.append(name, "newSingleValue");
    assert_equals(headers.get(name), value + ", newSingleValue");
  }
}, "Check append methods when called with already used name");
test(() => {
  for (const header of new Headers([["1", "a"], ["1", "b"]])) assert_array_equals(header, ["1", "a, b"]);
}, "Iterate combined values");
test(() => {
  const expected = [["1", "b"], ["2", "a, b"]];
  let i = 0;
  for (const header of new Headers([["2", "a"], ["1", "b"], ["2", "b"]])) assert_array_equals(header, expected[i++]);
  assert_equals(i, 2);
}, "Iterate combined values in sorted order");

file = "headers-errors.any.js";
test(() => { assert_throws_js(TypeError, () => new Headers([["name"]])); },
  "Create headers giving an array having one string as init argument");
test(() => { assert_throws_js(TypeError, () => new Headers([["invalid", "invalidValue1", "invalidValue2"]])); },
  "Create headers giving an array having three strings as init argument");
test(() => { assert_throws_js(TypeError, () => new Headers([["invalidĀ", "Value1"]])); },
  "Create headers giving bad header name as init argument");
test(() => { assert_throws_js(TypeError, () => new Headers([["name", "invalidValueĀ"]])); },
  "Create headers giving bad header value as init argument");
for (const [method, call] of [["get", (h, n) => h.get(n)], ["delete", (h, n) => h.delete(n)], ["has", (h, n) => h.has(n)],
  ["set", (h, n) => h.set(n, "Value1")]]) {
  for (const name of ["invalidĀ", {}]) {
    test(() => { assert_throws_js(TypeError, () => call(new Headers(), name)); },
      `Check headers ${method} with an invalid name ${name}`);
  }
}
test(() => { assert_throws_js(TypeError, () => new Headers().set("name", "invalidĀ")); },
  "Check headers set with an invalid value invalidĀ");
for (const name of ["invalidĀ", {}]) {
  // (The original appends "invalidĀ" under both names.)
  test(() => { assert_throws_js(TypeError, () => new Headers().append("invalidĀ", "Value1")); },
    `Check headers append with an invalid name ${name}`);
}
test(() => { assert_throws_js(TypeError, () => new Headers().append("name", "invalidĀ")); },
  "Check headers append with an invalid value invalidĀ");
test(() => {
  const headers = new Headers([["name", "value"]]);
  assert_throws_js(TypeError, () => headers.forEach());
  assert_throws_js(TypeError, () => headers.forEach(undefined));
  assert_throws_js(TypeError, () => headers.forEach(1));
}, "Headers forEach throws if argument is not callable");
test(() => {
  const headers = new Headers([["name1", "value1"], ["name2", "value2"], ["name3", "value3"]]);
  let counter = 0;
  try {
    headers.forEach((value, name) => {
      counter++;
      if (name === "name2") throw "error";
    });
  } catch (e) {
    assert_equals(counter, 2);
    assert_equals(e, "error");
    return;
  }
  assert_unreached();
}, "Headers forEach loop should stop if callback is throwing exception");

file = "headers-normalize.any.js";
const normalizations = { name1: [" space ", "space"], name2: ["\ttab\t", "tab"], name3: [" spaceAndTab\t", "spaceAndTab"],
  name4: ["\r\n newLine", "newLine"], name5: ["newLine\r\n ", "newLine"], name6: ["\r\n\tnewLine", "newLine"],
  name7: ["\t\f\tnewLine\n", "\f\tnewLine"], name8: ["newLine\xa0", "newLine\xa0"] };
test(() => {
  const headers = new Headers(Object.fromEntries(Object.entries(normalizations).map(([n, [given]]) => [n, given])));
  for (const name in normalizations) assert_equals(headers.get(name), normalizations[name][1], name);
}, "Create headers with not normalized values");
test(() => {
  const headers = new Headers();
  for (const name in normalizations) {
    headers.append(name, normalizations[name][0]);
    assert_equals(headers.get(name), normalizations[name][1], name);
  }
}, "Check append method with not normalized values");
test(() => {
  const headers = new Headers();
  for (const name in normalizations) {
    headers.set(name, normalizations[name][0]);
    assert_equals(headers.get(name), normalizations[name][1], name);
  }
}, "Check set method with not normalized values");

file = "headers-record.any.js";
let log = [];
const clearLog = () => { log = []; };
const addLogEntry = (name, args) => log.push([name, ...args]);
const loggingHandler = {};
for (const prop of Object.getOwnPropertyNames(Reflect)) {
  loggingHandler[prop] = (...args) => {
    addLogEntry(prop, args);
    return Reflect[prop](...args);
  };
}
test(() => { assert_equals([...new Headers()].length, 0); }, "Passing nothing to Headers constructor");
test(() => { assert_equals([...new Headers(undefined)].length, 0); }, "Passing undefined to Headers constructor");
test(() => { assert_throws_js(TypeError, () => new Headers(null)); }, "Passing null to Headers constructor");
// The log's first entries for a record: [[Get]] of @@iterator, [[OwnPropertyKeys]], then for each key its
// [[GetOwnProperty]] and (when enumerable) its [[Get]].
function checkLog(expected) {
  assert_equals(log.length, expected.length, "log length");
  expected.forEach((entry, i) => assert_array_equals(log[i], entry, `log[${i}]`));
}
test(function () {
  this.add_cleanup(clearLog);
  const record = { a: "b" };
  const proxy = new Proxy(record, loggingHandler);
  const h = new Headers(proxy);
  checkLog([["get", record, Symbol.iterator, proxy], ["ownKeys", record], ["getOwnPropertyDescriptor", record, "a"],
    ["get", record, "a", proxy]]);
  assert_equals([...h].length, 1);
  assert_array_equals([...h.keys()], ["a"]);
  assert_true(h.has("a"));
  assert_equals(h.get("a"), "b");
}, "Basic operation with one property");
test(function () {
  this.add_cleanup(clearLog);
  const record = Object.create({ c: "d" }, { a: { value: "b", enumerable: true } });
  const proxy = new Proxy(record, loggingHandler);
  const h = new Headers(proxy);
  checkLog([["get", record, Symbol.iterator, proxy], ["ownKeys", record], ["getOwnPropertyDescriptor", record, "a"],
    ["get", record, "a", proxy]]);
  assert_equals([...h].length, 1);
  assert_array_equals([...h.keys()], ["a"]);
  assert_true(h.has("a"));
  assert_equals(h.get("a"), "b");
}, "Basic operation with one property and a proto");
test(function () {
  this.add_cleanup(clearLog);
  const record = { a: "b", c: "d" };
  const proxy = new Proxy(record, loggingHandler);
  const h = new Headers(proxy);
  checkLog([["get", record, Symbol.iterator, proxy], ["ownKeys", record], ["getOwnPropertyDescriptor", record, "a"],
    ["get", record, "a", proxy], ["getOwnPropertyDescriptor", record, "c"], ["get", record, "c", proxy]]);
  assert_equals([...h].length, 2);
  assert_array_equals([...h.keys()], ["a", "c"]);
  assert_equals(h.get("a"), "b");
  assert_equals(h.get("c"), "d");
}, "Correct operation ordering with two properties");
test(function () {
  this.add_cleanup(clearLog);
  const record = { a: "b", "\uFFFF": "d" };
  const proxy = new Proxy(record, loggingHandler);
  assert_throws_js(TypeError, () => new Headers(proxy));
  checkLog([["get", record, Symbol.iterator, proxy], ["ownKeys", record], ["getOwnPropertyDescriptor", record, "a"],
    ["get", record, "a", proxy], ["getOwnPropertyDescriptor", record, "\uFFFF"]]);
}, "Correct operation ordering with two properties one of which has an invalid name");
test(function () {
  this.add_cleanup(clearLog);
  const record = { a: "\uFFFF", c: "d" };
  const proxy = new Proxy(record, loggingHandler);
  assert_throws_js(TypeError, () => new Headers(proxy));
  checkLog([["get", record, Symbol.iterator, proxy], ["ownKeys", record], ["getOwnPropertyDescriptor", record, "a"],
    ["get", record, "a", proxy]]);
}, "Correct operation ordering with two properties one of which has an invalid value");
test(function () {
  this.add_cleanup(clearLog);
  const record = {};
  Object.defineProperty(record, "a", { value: "b", enumerable: false });
  Object.defineProperty(record, "c", { value: "d", enumerable: true });
  Object.defineProperty(record, "e", { value: "f", enumerable: false });
  const proxy = new Proxy(record, loggingHandler);
  const h = new Headers(proxy);
  checkLog([["get", record, Symbol.iterator, proxy], ["ownKeys", record], ["getOwnPropertyDescriptor", record, "a"],
    ["getOwnPropertyDescriptor", record, "c"], ["get", record, "c", proxy], ["getOwnPropertyDescriptor", record, "e"]]);
  assert_equals([...h].length, 1);
  assert_array_equals([...h.keys()], ["c"]);
  assert_equals(h.get("c"), "d");
}, "Correct operation ordering with non-enumerable properties");
test(function () {
  this.add_cleanup(clearLog);
  const record = { a: "b", c: "d", e: "f" };
  const lying = new Proxy(record, {
    getOwnPropertyDescriptor: (target, name) => (name === "a" || name === "e" ? undefined : Reflect.getOwnPropertyDescriptor(target, name)),
  });
  const proxy = new Proxy(lying, loggingHandler);
  const h = new Headers(proxy);
  checkLog([["get", lying, Symbol.iterator, proxy], ["ownKeys", lying], ["getOwnPropertyDescriptor", lying, "a"],
    ["getOwnPropertyDescriptor", lying, "c"], ["get", lying, "c", proxy], ["getOwnPropertyDescriptor", lying, "e"]]);
  assert_equals([...h].length, 1);
  assert_array_equals([...h.keys()], ["c"]);
  assert_equals(h.get("c"), "d");
}, "Correct operation ordering with undefined descriptors");
test(function () {
  this.add_cleanup(clearLog);
  const lying = new Proxy({ a: "b", c: "d" }, { ownKeys: () => ["a", "c", "a", "c"] });
  const proxy = new Proxy(lying, loggingHandler);
  assert_throws_js(TypeError, () => new Headers(proxy));
  checkLog([["get", lying, Symbol.iterator, proxy], ["ownKeys", lying]]);
}, "Correct operation ordering with repeated keys");
test(function () {
  this.add_cleanup(clearLog);
  const record = {
    a: "b",
    [Symbol.toStringTag]: { toString() { addLogEntry("toString", [this]); return "nope"; } },
    c: "d",
  };
  const proxy = new Proxy(record, loggingHandler);
  assert_throws_js(TypeError, () => new Headers(proxy));
  checkLog([["get", record, Symbol.iterator, proxy], ["ownKeys", record], ["getOwnPropertyDescriptor", record, "a"],
    ["get", record, "a", proxy], ["getOwnPropertyDescriptor", record, "c"], ["get", record, "c", proxy],
    ["getOwnPropertyDescriptor", record, Symbol.toStringTag]]);
}, "Basic operation with Symbol keys");
test(function () {
  this.add_cleanup(clearLog);
  const record = {
    a: { toString() { addLogEntry("toString", [this]); return "b"; } },
    [Symbol.toStringTag]: { toString() { addLogEntry("toString", [this]); return "nope"; } },
    c: { toString() { addLogEntry("toString", [this]); return "d"; } },
  };
  Object.defineProperty(record, Symbol.toStringTag, { enumerable: false });
  assert_array_equals(Reflect.ownKeys(record), ["a", "c", Symbol.toStringTag]);
  const proxy = new Proxy(record, loggingHandler);
  const h = new Headers(proxy);
  checkLog([["get", record, Symbol.iterator, proxy], ["ownKeys", record], ["getOwnPropertyDescriptor", record, "a"],
    ["get", record, "a", proxy], ["toString", record.a], ["getOwnPropertyDescriptor", record, "c"],
    ["get", record, "c", proxy], ["toString", record.c], ["getOwnPropertyDescriptor", record, Symbol.toStringTag]]);
  assert_equals([...h].length, 2);
  assert_array_equals([...h.keys()], ["a", "c"]);
  assert_equals(h.get("a"), "b");
  assert_equals(h.get("c"), "d");
}, "Operation with non-enumerable Symbol keys");

file = "headers-structure.any.js";
for (const method of ["append", "delete", "get", "has", "set", "entries", "keys", "values"]) {
  test(() => { assert_true(method in new Headers(), method); }, `Headers has ${method} method`);
}

// header-values.any.js and header-values-normalize.any.js send their values with fetch() and XMLHttpRequest;
// here they are given to a Headers.
file = "header-values.any.js";
for (const code of [0, 0x0a, 0x0d]) {
  const value = "x" + String.fromCharCode(code) + "x";
  test(() => { assert_throws_js(TypeError, () => new Headers({ "value-test": value })); },
    `Headers with value ${encodeURI(value)} needs to throw`);
}
test(() => {
  const values = [];
  for (let i = 0; i < 0x100; i++) if (i !== 0 && i !== 0x0a && i !== 0x0d) values.push("x" + String.fromCharCode(i) + "x");
  const headers = new Headers();
  values.forEach((v, i) => headers.append("val" + i, v));
  values.forEach((v, i) => assert_equals(headers.get("val" + i), v, "val" + i));
}, "Headers with all valid values");

file = "header-values-normalize.any.js";
for (let i = 0; i < 0x21; i++) {
  if (i === 0x0b || i === 0x0c) continue; // (left out by the original too)
  const value = String.fromCharCode(i);
  const strip = i === 0x09 || i === 0x0a || i === 0x0d || i === 0x20;
  const expected = strip ? "" : value;
  test(() => {
    if (i === 0) {
      for (const v of [value, "x" + value, value + "x"]) assert_throws_js(TypeError, () => new Headers({ val: v }));
      return;
    }
    const headers = new Headers({ val1: value, val2: "x" + value, val3: value + "x" });
    assert_equals(headers.get("val1"), expected);
    assert_equals(headers.get("val2"), "x" + expected);
    assert_equals(headers.get("val3"), expected + "x");
  }, `Headers with value ${encodeURI(value)}`);
}

// --- fetch/api/request -----------------------------------------------------------------------------------------

file = "request-structure.any.js";
{
  const request = new Request(BASE);
  for (const method of ["clone", "arrayBuffer", "blob", "formData", "json", "text"]) {
    test(() => { assert_true(method in request, method); }, `Request has ${method} method`);
  }
  const readOnly = {
    method: ["GET", "POST"], url: [undefined, "http://url.test"], destination: ["", "worker"],
    referrer: ["about:client", "http://url.test"], referrerPolicy: ["", "unsafe-url"], mode: ["cors", "navigate"],
    credentials: ["same-origin", "cors"], cache: ["default", "reload"], redirect: ["follow", "manual"],
    integrity: [undefined, "CannotWriteIntegrity"], isReloadNavigation: [false, true],
    isHistoryNavigation: [false, true], duplex: ["half", "full"], bodyUsed: [false, true],
  };
  for (const attribute of ["method", "url", "headers", "destination", "referrer", "referrerPolicy", "mode",
    "credentials", "cache", "redirect", "integrity", "isReloadNavigation", "isHistoryNavigation", "duplex", "bodyUsed"]) {
    test(() => {
      assert_true(attribute in request, attribute);
      if (attribute === "headers") {
        Reflect.set(request, "headers", new Headers({ name: "value" })); // (a module is strict: no assignment)
        assert_false(request.headers.has("name"), "headers is read only");
        return;
      }
      const [defaultValue, newValue] = readOnly[attribute];
      Reflect.set(request, attribute, newValue);
      if (defaultValue === undefined) assert_not_equals(request[attribute], newValue, `${attribute} is read only`);
      else assert_equals(request[attribute], defaultValue, `${attribute} is read only`);
    }, `Check ${attribute} attribute`);
  }
  for (const attribute of ["priority", "internalpriority", "blocking"]) {
    test(() => { assert_false(attribute in request, attribute); }, `Request does not expose ${attribute} attribute`);
  }
}

file = "request-headers.any.js";
for (const [name, value] of [["Content-Type", "OK"], ["Potato", "OK"], ["proxy", "OK"], ["proxya", "OK"], ["sec", "OK"],
  ["secb", "OK"], ["Set-Cookie2", "OK"], ["User-Agent", "OK"]]) {
  test(() => {
    const request = new Request(BASE);
    request.headers.set(name, value);
    assert_equals(request.headers.get(name), value);
  }, `Adding valid request header "${name}: ${value}"`);
}
for (const name of ["Accept-Charset", "accept-charset", "ACCEPT-ENCODING", "Accept-Encoding",
  "Access-Control-Request-Headers", "Access-Control-Request-Method", "Connection", "Content-Length", "Cookie",
  "Cookie2", "Date", "DNT", "Expect", "Host", "Keep-Alive", "Origin", "Referer", "Set-Cookie", "TE", "Trailer",
  "Transfer-Encoding", "Upgrade", "Via", "Proxy-", "proxy-a", "Sec-", "sec-b"]) {
  test(() => {
    const request = new Request(BASE);
    request.headers.set(name, "KO");
    assert_equals(request.headers.get(name), null);
  }, `Adding invalid request header "${name}: KO"`);
}
for (const [name, value] of [["Accept", "OK"], ["Accept-Language", "OK"], ["content-language", "OK"],
  ["content-type", "application/x-www-form-urlencoded"], ["content-type", "application/x-www-form-urlencoded;charset=UTF-8"],
  ["content-type", "multipart/form-data"], ["content-type", "multipart/form-data;charset=UTF-8"],
  ["content-TYPE", "text/plain"], ["CONTENT-type", "text/plain;charset=UTF-8"]]) {
  test(() => {
    const request = new Request(BASE, { mode: "no-cors" });
    request.headers.set(name, value);
    assert_equals(request.headers.get(name), value);
  }, `Adding valid no-cors request header "${name}: ${value}"`);
}
for (const [name, value] of [["Content-Type", "KO"], ["Potato", "KO"], ["proxy", "KO"], ["proxya", "KO"], ["sec", "KO"],
  ["secb", "KO"], ["Empty-Value", ""]]) {
  test(() => {
    const request = new Request(BASE, { mode: "no-cors" });
    request.headers.set(name, value);
    assert_equals(request.headers.get(name), null);
  }, `Adding invalid no-cors request header "${name}: ${value}"`);
}
test(() => {
  const request = new Request(BASE, { headers: new Headers([["Cookie2", "potato"]]) });
  assert_equals(request.headers.get("Cookie2"), null);
}, "Check that request constructor is filtering headers provided as init parameter");
test(() => {
  const request = new Request(BASE, { headers: new Headers([["Content-Type", "potato"]]), mode: "no-cors" });
  assert_equals(request.headers.get("Content-Type"), null);
}, "Check that no-cors request constructor is filtering headers provided as init parameter");
test(() => {
  const initial = new Request(BASE, { headers: new Headers([["Content-Type", "potato"]]) });
  assert_equals(new Request(initial, { mode: "no-cors" }).headers.get("Content-Type"), null);
}, "Check that no-cors request constructor is filtering headers provided as part of request parameter");
function contentTypeCases() {
  test(() => {
    const initial = new Request(BASE, { headers: new Headers([["Content-Type", "potato"]]) });
    assert_equals(new Request(initial).headers.get("Content-Type"), "potato");
  }, "Request should get its content-type from the init request");
  test(() => {
    const initial = new Request(BASE, { headers: new Headers([["Content-Type", "potato"]]) });
    assert_false(new Request(initial, { headers: new Headers([]) }).headers.has("Content-Type"));
  }, "Request should not get its content-type from the init request if init headers are provided");
  test(() => {
    const initial = new Request(BASE, { headers: new Headers([["Content-Type-Extra", "potato"]]), body: "this is my plate",
      method: "POST" });
    assert_equals(new Request(initial).headers.get("Content-Type"), "text/plain;charset=UTF-8");
  }, "Request should get its content-type from the body if none is provided");
  test(() => {
    const initial = new Request(BASE, { headers: new Headers([["Content-Type", "potato"]]), body: "this is my plate",
      method: "POST" });
    assert_equals(new Request(initial).headers.get("Content-Type"), "potato");
  }, "Request should get its content-type from init headers if one is provided");
}
contentTypeCases();
test(() => {
  const array = [["hello", "worldAHH"]];
  const headers = new Headers(array);
  assert_equals(headers.get("hello"), "worldAHH");
  assert_equals(new Request(BASE, { headers }).headers.get("hello"), "worldAHH");
  assert_equals(new Request(BASE, { headers: array }).headers.get("hello"), "worldAHH");
  assert_equals(new Request(BASE, { headers: { hello: "worldOOH" } }).headers.get("hello"), "worldOOH");
}, "Testing request header creations with various objects");
promise_test(async () => {
  const request = new Request(BASE, { headers: [["Content-Type", ""]], body: "this is my plate", method: "POST" });
  assert_equals((await request.blob()).type, "");
}, "Testing empty Request Content-Type header");
test(() => {
  const r1 = new Request(BASE);
  assert_equals(r1.headers, r1.headers);
  const r2 = new Request(BASE, { headers: { "X-Foo": "bar" } });
  assert_equals(r2.headers, r2.headers);
  const headers = r2.headers;
  r2.headers.set("X-Foo", "quux");
  assert_equals(headers, r2.headers);
  headers.set("X-Other-Header", "baz");
  assert_equals(headers, r2.headers);
}, "Test that Request.headers has the [SameObject] extended attribute");

file = "request-init-001.sub.html";
{
  const origin = new URL(BASE).origin;
  const inits = {
    method: [["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "get", "head", "post", "put", "delete", "options",
      "Get", "hEad", "poSt", "Put", "deleTe", "optionS", "PATCH", "patch", "patCh"],
    ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "GET", "HEAD",
      "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "patch", "patCh"]],
    referrer: [["/relative/ressource", `${origin}/relative/ressource?query=true#fragment`, `${origin}/`, "http://test.url",
      "about:client", ""],
    [`${origin}/relative/ressource`, `${origin}/relative/ressource?query=true#fragment`, `${origin}/`, "about:client",
      "about:client", ""]],
    referrerPolicy: [["", "no-referrer", "no-referrer-when-downgrade", "origin", "origin-when-cross-origin", "unsafe-url",
      "same-origin", "strict-origin", "strict-origin-when-cross-origin"]],
    mode: [["same-origin", "no-cors", "cors"]],
    credentials: [["omit", "same-origin", "include"]],
    cache: [["default", "no-store", "reload", "no-cache", "force-cache"]],
    redirect: [["follow", "error", "manual"]],
    integrity: [["", "AZERTYUIOP1234567890"]],
    window: [[null], [undefined]],
  };
  for (const [attribute, [given, expected = given]] of Object.entries(inits)) {
    given.forEach((value, i) => {
      test(() => {
        const request = new Request(BASE, { [attribute]: value });
        assert_equals(request[attribute], expected[i], `${attribute} of ${value}`);
      }, `Check ${attribute} init value of ${value} and associated getter`);
    });
  }
}

file = "request-init-002.any.js";
test(() => {
  const dict = { name1: "value1", name2: "value2", name3: "value3" };
  const request = new Request(BASE, { headers: new Headers(dict) });
  for (const name in dict) assert_equals(request.headers.get(name), dict[name], name);
}, "Initialize Request with headers values");
function checkRequestInit(makeBody, shown, bodyType, expectedText) {
  promise_test(async () => {
    const body = makeBody();
    const request = new Request(BASE, { method: "POST", body });
    if (body) {
      assert_throws_js(TypeError, () => new Request(BASE, { method: "GET", body }));
      assert_throws_js(TypeError, () => new Request(BASE, { method: "HEAD", body }));
    } else {
      new Request(BASE, { method: "GET", body });
    }
    const mime = request.headers.get("Content-Type");
    assert_true(!body || (mime !== null && mime.search(bodyType) > -1), `Content-Type ${mime}`);
    assert_true((await request.text()).search(expectedText) > -1, "the body");
  }, `Initialize Request's body with "${shown}", ${bodyType}`);
}
checkRequestInit(() => undefined, "undefined", undefined, "");
checkRequestInit(() => null, "null", null, "");
checkRequestInit(() => new Blob(["This is a blob"], { type: "application/octet-binary" }), "[object Blob]",
  "application/octet-binary", "This is a blob");
checkRequestInit(() => { const f = new FormData(); f.append("name", "value"); return f; }, "[object FormData]",
  "multipart/form-data", "name=\"name\"\r\n\r\nvalue");
checkRequestInit(() => "This is a USVString", "This is a USVString", "text/plain;charset=UTF-8", "This is a USVString");
checkRequestInit(() => ({ toString: () => "hi!" }), "hi!", "text/plain;charset=UTF-8", "hi!");
checkRequestInit(() => new URLSearchParams("name=value"), "name=value",
  "application/x-www-form-urlencoded;charset=UTF-8", "name=value");

file = "request-init-003.sub.html";
{
  const origin = new URL(BASE).origin;
  const headers = new Headers({ name: "value" });
  const init = { method: "POST", referrer: `${origin}/`, referrerPolicy: "origin", mode: "same-origin",
    credentials: "include", cache: "no-cache", redirect: "error", integrity: "Request's Integrity", headers,
    body: "Request's body" };
  const expectedInitialized = { ...init };
  const expectedDefault = { method: "GET", url: BASE, referrer: "about:client", referrerPolicy: "", mode: "cors",
    credentials: "same-origin", cache: "default", redirect: "follow", integrity: "", headers: new Headers() };
  test(() => {
    checkRequest(new Request(new Request(BASE, init)), expectedInitialized);
  }, "Check request values when initialized from Request");
  test(() => {
    checkRequest(new Request(new Request(BASE), init), expectedInitialized);
  }, "Check request values when initialized from Request and init values");
  test(() => {
    const url = "http://url.test:1234/path/subpath?query=true#fragment";
    checkRequest(new Request(url), { ...expectedDefault, url });
  }, "Check request values when initialized from url string");
  test(() => {
    const url = "http://url.test:1234/path/subpath?query=true#fragment";
    checkRequest(new Request(url, init), { ...expectedInitialized, url });
  }, "Check request values when initialized from url and init values");
}

file = "request-error.any.js";
{
  const bad = [
    [[BASE, { window: "http://test.url" }], "RequestInit's window is not null"],
    [["http://:not a valid URL"], "Input URL is not valid"],
    [["http://user:pass@test.url"], "Input URL has credentials"],
    [[BASE, { mode: "navigate" }], "RequestInit's mode is navigate"],
    [[BASE, { referrer: "http://:not a valid URL" }], "RequestInit's referrer is invalid"],
    [[BASE, { method: "IN VALID" }], "RequestInit's method is invalid"],
    [[BASE, { method: "TRACE" }], "RequestInit's method is forbidden"],
    [[BASE, { mode: "no-cors", method: "PUT" }], "RequestInit's mode is no-cors and method is not simple"],
    [[BASE, { mode: "cors", cache: "only-if-cached" }], "RequestInit's cache mode is only-if-cached and mode is not same-origin"],
    [[rel("test"), { cache: "only-if-cached", mode: "cors" }], "Request with cache mode: only-if-cached and fetch mode cors"],
    [[rel("test"), { cache: "only-if-cached", mode: "no-cors" }], "Request with cache mode: only-if-cached and fetch mode no-cors"],
  ];
  for (const member of ["referrerPolicy", "mode", "credentials", "cache", "redirect"]) {
    bad.push([[BASE, { [member]: "BAD" }], `Bad ${member} init parameter value`]);
  }
  for (const [args, name] of bad) test(() => { assert_throws_js(TypeError, () => new Request(...args)); }, name);
  test(() => { assert_throws_js(TypeError, () => Request("about:blank")); }, "Request error");
  contentTypeCases();
  test(() => { new Request(rel("test"), { cache: "only-if-cached", mode: "same-origin" }); },
    "Request with cache mode: only-if-cached and fetch mode: same-origin");
}

file = "forbidden-method.any.js";
for (const method of ["CONNECT", "TRACE", "TRACK", "connect", "trace", "track"]) {
  test(() => { assert_throws_js(TypeError, () => new Request(rel("./"), { method })); },
    `Request() with a forbidden method ${method} must throw.`);
}

file = "request-init-priority.any.js";
for (const priority of ["high", "low", "auto"]) {
  test(() => { new Request(BASE, { priority }); }, `new Request() with a '${priority}' priority does not throw an error`);
}
test(() => { assert_throws_js(TypeError, () => new Request(BASE, { priority: "invalid" })); },
  "new Request() throws a TypeError if any of RequestInit's members' values are invalid");

file = "request-keepalive.any.js";
test(() => {
  const url = rel("/");
  assert_false(new Request(url).keepalive, "default");
  assert_true(new Request(url, { keepalive: true }).keepalive, "true");
  assert_false(new Request(url, { keepalive: false }).keepalive, "false");
  assert_true(new Request(url, { keepalive: 1 }).keepalive, "truish");
  assert_false(new Request(url, { keepalive: 0 }).keepalive, "falsy");
}, "keepalive flag");
test(() => {
  assert_throws_js(TypeError, () => new Request(rel("/"), { method: "POST", keepalive: true, body: new ReadableStream() }));
}, "keepalive flag with stream body");

file = "request-clone.sub.html";
test(() => {
  const init = { method: "POST", referrer: `${new URL(BASE).origin}/`, referrerPolicy: "origin", mode: "same-origin",
    credentials: "include", cache: "no-cache", redirect: "error", integrity: "Request's Integrity",
    headers: new Headers({ name: "value" }), body: "Request's body" };
  checkRequest(new Request(BASE, init).clone(), init);
}, "Check cloning a request");
test(() => {
  const initial = new Request(BASE, { headers: new Headers({ a: "1", b: "2" }) });
  const request = initial.clone();
  assert_equals(request.headers.get("a"), "1");
  assert_equals(request.headers.get("b"), "2");
  initial.headers.delete("a");
  assert_equals(request.headers.get("a"), "1", "the clone keeps its own headers");
  request.headers.delete("a");
  assert_equals(initial.headers.get("b"), "2");
}, "Check cloning a request copies the headers");

file = "request-constructor-init-body-override.any.js";
promise_test(async () => {
  const req1 = new Request("https://example.com/", { body: "req1", method: "POST" });
  assert_equals(await req1.text(), "req1");
  const req2 = new Request(req1, { body: "req2" });
  assert_equals(await req2.text(), "req2");
}, "Check that the body of a new request can be overridden when created from an existing Request object");
promise_test(async () => {
  const req1 = new Request("https://example.com/", { body: "req1", method: "POST" });
  const req2 = new Request("https://example.com/", req1);
  assert_equals(await req2.text(), "req1");
}, "Check that the body of a new request can be duplicated from an existing Request object");

file = "request-consume-empty.any.js";
{
  const checks = {
    text: async (r) => { assert_equals(await r.text(), ""); assert_false(r.bodyUsed); },
    blob: async (r) => { assert_equals(await (await r.blob()).text(), ""); assert_false(r.bodyUsed); },
    arrayBuffer: async (r) => { assert_equals((await r.arrayBuffer()).byteLength, 0); assert_false(r.bodyUsed); },
    json: async (r) => {
      await r.json().then(() => assert_unreached("JSON parsing should fail"), () => assert_false(r.bodyUsed));
    },
    formData: async (r) => { assert_true((await r.formData()) instanceof FormData); assert_false(r.bodyUsed); },
    formDataError: async (r, t) => { await promise_rejects_js(t, TypeError, r.formData()); assert_false(r.bodyUsed); },
  };
  const noBody = [["text", checks.text], ["blob", checks.blob], ["arrayBuffer", checks.arrayBuffer],
    ["json (error case)", checks.json],
    ["formData with correct multipart type (error case)", checks.formDataError, [["Content-Type", 'multipart/form-data; boundary="boundary"']]],
    ["formData with correct urlencoded type", checks.formData, [["Content-Type", "application/x-www-form-urlencoded;charset=UTF-8"]]],
    ["formData without correct type (error case)", checks.formDataError]];
  for (const [type, check, headers = []] of noBody) {
    promise_test((t) => {
      const request = new Request(BASE, { method: "POST", headers });
      assert_false(request.bodyUsed);
      return check(request, t);
    }, `Consume request's body as ${type}`);
  }
  const emptyBodies = [["blob", () => new Blob([], { type: "text/plain" }), false], ["text", () => "", false],
    ["blob", () => new Blob([], { type: "text/plain" }), true], ["text", () => "", true],
    ["URLSearchParams", () => new URLSearchParams(""), true], ["FormData", () => new FormData(), true],
    ["ArrayBuffer", () => new ArrayBuffer(), true]];
  for (const [type, body, asText] of emptyBodies) {
    promise_test(async () => {
      const request = new Request(BASE, { method: "POST", body: body() });
      assert_false(request.bodyUsed, "bodyUsed is false at first");
      if (asText) assert_equals((await request.text()).length, 0);
      else assert_equals((await request.arrayBuffer()).byteLength, 0);
      assert_true(request.bodyUsed, "bodyUsed is true once consumed");
    }, `Consume empty ${type} request body as ${asText ? "text" : "arrayBuffer"}`);
  }
}

file = "request-consume.any.js";
{
  const checkText = async (r, expected) => { assert_equals(await r.text(), expected); assert_true(r.bodyUsed); };
  const checkBlob = async (r, expected) => { assert_equals(await (await r.blob()).text(), expected); assert_true(r.bodyUsed); };
  const checkArrayBuffer = async (r, expected) => {
    validateBufferFromString(await r.arrayBuffer(), expected);
    assert_true(r.bodyUsed);
  };
  const checkBytes = async (r, expected) => {
    const bytes = await r.bytes();
    assert_true(bytes instanceof Uint8Array);
    validateBufferFromString(bytes.buffer, expected);
    assert_true(r.bodyUsed);
  };
  const checkJson = async (r, expected) => { assert_equals(JSON.stringify(await r.json()), expected); assert_true(r.bodyUsed); };
  const checkRequestBody = (makeBody, expected, type) => {
    promise_test(() => {
      const r = new Request(BASE, { method: "POST", body: makeBody(), headers: [["Content-Type", "text/PLAIN"]] });
      assert_false(r.bodyUsed);
      return checkText(r, expected);
    }, `Consume ${type} request's body as text`);
    for (const [as, check] of [["blob", checkBlob], ["arrayBuffer", checkArrayBuffer], ["bytes", checkBytes],
      ["JSON", checkJson]]) {
      promise_test(() => {
        const r = new Request(BASE, { method: "POST", body: makeBody() });
        assert_false(r.bodyUsed);
        return check(r, expected);
      }, `Consume ${type} request's body as ${as}`);
    }
  };
  const textData = JSON.stringify("This is response's body");
  checkRequestBody(() => textData, textData, "String");
  const string = "\"123456\"";
  const buffer = () => { const b = new ArrayBuffer(8); new Int8Array(b).set(stringToArray(string)); return b; };
  const withZeros = () => { const b = new ArrayBuffer(10); new Int8Array(b).set(stringToArray(string), 1); return b; };
  checkRequestBody(buffer, string, "ArrayBuffer");
  checkRequestBody(() => new Uint8Array(buffer()), string, "Uint8Array");
  checkRequestBody(() => new Int8Array(withZeros(), 1, 8), string, "Int8Array");
  checkRequestBody(() => new Float32Array(buffer()), string, "Float32Array");
  checkRequestBody(() => new DataView(withZeros(), 1, 8), string, "DataView");
  promise_test(async () => {
    const formData = new FormData();
    formData.append("name", "value");
    const r = new Request(BASE, { method: "POST", body: formData });
    assert_false(r.bodyUsed);
    assert_true((await r.formData()) instanceof FormData);
    assert_true(r.bodyUsed);
  }, "Consume FormData request's body as FormData");
  const blob = () => new Blob([textData], { type: "text/plain" });
  for (const [as, check] of [["blob", checkBlob], ["text", checkText], ["json", checkJson],
    ["arrayBuffer", checkArrayBuffer], ["bytes", checkBytes]]) {
    promise_test(() => {
      const r = new Response(blob());
      assert_false(r.bodyUsed);
      return check(r, textData);
    }, `Consume blob response's body as ${as}`);
  }
  promise_test(() => checkBlob(new Response(new Blob([""])), ""), "Consume blob response's body as blob (empty blob as input)");
  for (const value of ["null", "1", "true", "\"string\""]) {
    promise_test(async () => {
      assert_equals(await new Request(BASE, { method: "POST", body: value }).json(), JSON.parse(value));
    }, `Consume JSON from text: '${JSON.stringify(value)}'`);
  }
  for (const value of ["undefined", "{", "a", "["]) {
    promise_test((t) => promise_rejects_js(t, SyntaxError, new Request(BASE, { method: "POST", body: value }).json()),
      `Trying to consume bad JSON text as JSON: '${value}'`);
  }
}

file = "request-disturbed.any.js";
{
  const init = { method: "POST", body: "Request's body" };
  const noBodyConsumed = new Request(BASE);
  const bodyConsumed = new Request(BASE, init);
  test(() => {
    assert_equals(noBodyConsumed.body, null);
    assert_false(noBodyConsumed.bodyUsed);
    assert_not_equals(bodyConsumed.body, null);
    assert_true(bodyConsumed.body instanceof ReadableStream);
    assert_false(noBodyConsumed.bodyUsed);
  }, "Request's body: initial state");
  const disturb = () => {
    noBodyConsumed.text().catch(() => {});
    bodyConsumed.text().catch(() => {});
  };
  test(() => {
    disturb();
    assert_false(noBodyConsumed.bodyUsed);
    noBodyConsumed.clone();
  }, "Request without body cannot be disturbed");
  test(() => {
    assert_true(bodyConsumed.bodyUsed);
    assert_throws_js(TypeError, () => bodyConsumed.clone());
  }, "Check cloning a disturbed request");
  test(() => {
    assert_true(bodyConsumed.bodyUsed);
    assert_throws_js(TypeError, () => new Request(bodyConsumed));
  }, "Check creating a new request from a disturbed request");
  promise_test(async () => {
    assert_true(bodyConsumed.bodyUsed);
    const original = bodyConsumed.body;
    const replaced = new Request(bodyConsumed, { body: "Replaced body" });
    assert_not_equals(replaced.body, original, "a new body");
    assert_false(replaced.bodyUsed);
    assert_equals(await replaced.text(), "Replaced body");
  }, "Check creating a new request with a new body from a disturbed request");
  promise_test(async () => {
    const request = new Request(BASE, init);
    const original = request.body;
    assert_false(request.bodyUsed);
    const fromRequest = new Request(request);
    assert_true(request.bodyUsed);
    assert_equals(request.body, original, "the body stays");
    assert_not_equals(original, undefined);
    assert_not_equals(original, null);
    assert_not_equals(fromRequest.body, original, "a new body");
    assert_equals(await fromRequest.text(), "Request's body");
  }, "Input request used for creating new request became disturbed");
  promise_test(async () => {
    const request = new Request(BASE, init);
    const original = request.body;
    assert_false(request.bodyUsed);
    const fromRequest = new Request(request, { body: "init body" });
    assert_true(request.bodyUsed);
    assert_equals(request.body, original, "the body stays");
    assert_not_equals(original, undefined);
    assert_not_equals(original, null);
    assert_not_equals(fromRequest.body, original, "a new body");
    assert_equals(await fromRequest.text(), "init body");
  }, "Input request used for creating new request became disturbed even if body is not used");
  promise_test((t) => {
    assert_true(bodyConsumed.bodyUsed);
    return promise_rejects_js(t, TypeError, bodyConsumed.text());
  }, "Check consuming a disturbed request");
  test(() => {
    const req = new Request(BASE, { method: "POST", body: "hello" });
    assert_false(req.bodyUsed);
    assert_throws_js(TypeError, () => new Request(req, { method: "GET" }), "a GET request has no body");
    assert_false(req.bodyUsed, "after the GET case");
    assert_throws_js(TypeError, () => new Request(req, { method: "CONNECT" }), "a forbidden method");
    assert_false(req.bodyUsed, "after the forbidden method case");
    new Request(req);
    assert_true(req.bodyUsed);
  }, 'Request construction failure should not set "bodyUsed"');
}

file = "request-init-contenttype.any.js";
{
  const fromBody = (body, headers) => new Request("https://example.com", { method: "POST", body, headers, duplex: "half" });
  const OVERRIDE = "test/only; mime=type";
  const bodies = [["empty body", () => undefined, null], ["Blob body (no type set)", () => new Blob([]), null],
    ["Blob body (empty type)", () => new Blob([], { type: "" }), null],
    ["Blob body (set type)", () => new Blob([], { type: "a/b; c=d" }), "a/b; c=d"],
    ["buffer source body", () => new Uint8Array(), null],
    ["URLSearchParams body", () => new URLSearchParams(), "application/x-www-form-urlencoded;charset=UTF-8"],
    ["string body", () => "", "text/plain;charset=UTF-8"], ["ReadableStream body", () => new ReadableStream(), null]];
  for (const [what, body, expected] of bodies.slice(0, 5)) {
    test(() => { assert_equals(fromBody(body()).headers.get("Content-Type"), expected); }, `Default Content-Type for Request with ${what}`);
  }
  promise_test(async () => {
    const formData = new FormData();
    formData.append("a", "b");
    const request = fromBody(formData);
    const boundary = (await request.text()).split("\r\n")[0].slice(2);
    assert_equals(request.headers.get("Content-Type"), `multipart/form-data; boundary=${boundary}`);
  }, "Default Content-Type for Request with FormData body");
  for (const [what, body, expected] of bodies.slice(5)) {
    test(() => { assert_equals(fromBody(body()).headers.get("Content-Type"), expected); }, `Default Content-Type for Request with ${what}`);
  }
  bodies.splice(5, 0, ["FormData body", () => new FormData()]);
  for (const [what, body] of bodies) {
    test(() => {
      assert_equals(fromBody(body(), { "Content-Type": OVERRIDE }).headers.get("Content-Type"), OVERRIDE);
    }, `Can override Content-Type for Request with ${what}`);
  }
}

file = "request-init-stream.any.js";
{
  const method = "POST", duplex = "half";
  const url = rel("...");
  test(() => {
    const body = new ReadableStream();
    assert_equals(new Request(url, { method, body, duplex }).body, body);
  }, "Constructing a Request with a stream holds the original object.");
  test(() => {
    const body = new ReadableStream();
    body.getReader();
    assert_throws_js(TypeError, () => new Request(url, { method, body, duplex }));
  }, "Constructing a Request with a stream on which getReader() is called");
  test(() => {
    const body = new ReadableStream();
    body.getReader().read();
    assert_throws_js(TypeError, () => new Request(url, { method, body, duplex }));
  }, "Constructing a Request with a stream on which read() is called");
  promise_test(async () => {
    const body = new ReadableStream({ pull: (c) => c.enqueue(new Uint8Array()) });
    const reader = body.getReader();
    await reader.read();
    reader.releaseLock();
    assert_throws_js(TypeError, () => new Request(url, { method, body, duplex }));
  }, "Constructing a Request with a stream on which read() and releaseLock() are called");
  test(() => {
    const request = new Request(url, { method: "POST", body: "..." });
    request.body.getReader();
    assert_throws_js(TypeError, () => new Request(request));
    new Request(request, { body: "..." });
  }, "Constructing a Request with a Request on which body.getReader() is called");
  test(() => {
    const request = new Request(url, { method: "POST", body: "..." });
    request.body.getReader().read();
    assert_throws_js(TypeError, () => new Request(request));
    new Request(request, { body: "..." });
  }, "Constructing a Request with a Request on which body.getReader().read() is called");
  promise_test(async () => {
    const request = new Request(url, { method: "POST", body: "..." });
    const reader = request.body.getReader();
    await reader.read();
    reader.releaseLock();
    assert_throws_js(TypeError, () => new Request(request));
    new Request(request, { body: "..." });
  }, "Constructing a Request with a Request on which read() and releaseLock() are called");
  const kinds = [["null", () => null], ["a string", () => "..."], ["a Uint8Array", () => new Uint8Array(3)],
    ["a Blob", () => new Blob([])]];
  for (const [what, body] of kinds) {
    test(() => { new Request(url, { method, body: body() }); }, `It is OK to omit .duplex when the body is ${what}.`);
  }
  test(() => {
    assert_throws_js(TypeError, () => new Request(url, { method, body: new ReadableStream() }));
  }, "It is error to omit .duplex when the body is a ReadableStream.");
  kinds.push(["a ReadableStream", () => new ReadableStream()]);
  for (const [what, body] of kinds) {
    test(() => { new Request(url, { method, body: body(), duplex: "half" }); }, `It is OK to set .duplex = 'half' when the body is ${what}.`);
  }
  for (const [what, body] of kinds) {
    test(() => {
      assert_throws_js(TypeError, () => new Request(url, { method, body: body(), duplex: "full" }));
    }, `It is error to set .duplex = 'full' when the body is ${what}.`);
  }
  test(() => {
    const req1 = new Request(url, { method, body: new ReadableStream(), duplex });
    new Request(req1);
  }, "It is OK to omit duplex when init.body is not given and input.body is given.");
}

// --- fetch/api/response ----------------------------------------------------------------------------------------

file = "response-init-001.any.js";
{
  const defaults = { type: "default", url: "", ok: true, status: 200, statusText: "", body: null };
  const response = new Response();
  for (const attribute in defaults) {
    test(() => { assert_equals(response[attribute], defaults[attribute]); }, `Check default value for ${attribute} attribute`);
  }
  const inits = { status: [200, 300, 400, 500, 599], statusText: ["", "OK", "with space", String.fromCharCode(0x80)] };
  for (const attribute in inits) {
    test(() => {
      for (const value of inits[attribute]) {
        const r = new Response("", { [attribute]: value });
        assert_equals(r[attribute], value, `${attribute} ${value}`);
        assert_equals(r.ok, r.status >= 200 && r.status <= 299, "ok");
      }
    }, `Check ${attribute} init values and associated getter`);
  }
  test(() => {
    const r1 = new Response("");
    assert_equals(r1.headers, r1.headers);
    const r2 = new Response("", { headers: { "X-Foo": "bar" } });
    assert_equals(r2.headers, r2.headers);
    const headers = r2.headers;
    r2.headers.set("X-Foo", "quux");
    assert_equals(headers, r2.headers);
    headers.set("X-Other-Header", "baz");
    assert_equals(headers, r2.headers);
  }, "Test that Response.headers has the [SameObject] extended attribute");
}

file = "response-init-002.any.js";
test(() => {
  const dict = { name1: "value1", name2: "value2", name3: "value3" };
  const response = new Response("", { headers: new Headers(dict) });
  for (const name in dict) assert_equals(response.headers.get(name), dict[name], name);
}, "Initialize Response with headers values");
for (const [body, type, expected] of [
  [() => new Blob(["This is a blob"], { type: "application/octet-binary" }), "application/octet-binary", "This is a blob"],
  [() => { const f = new FormData(); f.append("name", "value"); return f; }, "multipart/form-data", "name=\"name\"\r\n\r\nvalue"],
  [() => new URLSearchParams("name=value"), "application/x-www-form-urlencoded;charset=UTF-8", "name=value"],
  [() => "This is a USVString", "text/plain;charset=UTF-8", "This is a USVString"],
]) {
  promise_test(async () => {
    const response = new Response(body());
    const mime = response.headers.get("Content-Type");
    assert_true(mime !== null && mime.search(type) > -1, `Content-Type ${mime}`);
    assert_true((await response.text()).search(expected) > -1, "the body");
  }, `Initialize Response's body with ${type}`);
}
promise_test(() => validateStreamFromString(new Response("This is response body").body.getReader(), "This is response body"),
  "Read Response's body as readableStream");
promise_test(async () => {
  const response = new Response("This is my fork", { headers: [["Content-Type", ""]] });
  assert_equals((await response.blob()).type, "");
}, "Testing empty Response Content-Type header");
test(() => { assert_equals(new Response(null, { status: 204 }).body, null); }, "Testing null Response body");

file = "response-error.any.js";
for (const status of [0, 100, 199, 600, 1000]) {
  test(() => { assert_throws_js(RangeError, () => new Response("", { status })); },
    `Throws RangeError when responseInit's status is ${status}`);
}
for (const statusText of ["\n", "Ā"]) {
  test(() => { assert_throws_js(TypeError, () => new Response("", { statusText })); },
    `Throws TypeError when responseInit's statusText is ${statusText}`);
}
for (const status of [204, 205, 304]) {
  test(() => { assert_throws_js(TypeError, () => new Response("body", { status })); },
    `Throws TypeError when building a response with body and a body status of ${status}`);
}

file = "response-static-error.any.js";
test(() => {
  const r = Response.error();
  assert_equals(r.type, "error");
  assert_equals(r.status, 0);
  assert_equals(r.statusText, "");
  assert_equals(r.body, null);
  assert_true(r.headers.entries().next().done, "no headers");
}, "Check response returned by static method error()");
test(() => {
  const headers = Response.error().headers;
  assert_true(!!headers);
  assert_equals(typeof headers.append, "function");
  assert_throws_js(TypeError, () => headers.append("name", "value"));
}, "the 'guard' of the Headers instance should be immutable");

file = "response-static-json.any.js";
{
  const JSON_TYPE = "application/json";
  const inits = [[undefined, 200, "", JSON_TYPE, {}], [{ status: 400 }, 400, "", JSON_TYPE, {}],
    [{ statusText: "foo" }, 200, "foo", JSON_TYPE, {}], [{ headers: {} }, 200, "", JSON_TYPE, {}],
    [{ headers: { "content-type": "foo/bar" } }, 200, "", "foo/bar", {}],
    [{ headers: { "x-foo": "bar" } }, 200, "", JSON_TYPE, { "x-foo": "bar" }]];
  for (const [init, status, statusText, type, headers] of inits) {
    promise_test(async () => {
      const r = Response.json("hello world", init);
      assert_equals(r.type, "default");
      assert_equals(r.status, status);
      assert_equals(r.statusText, statusText);
      assert_equals(r.headers.get("content-type"), type);
      for (const key in headers) assert_equals(r.headers.get(key), headers[key], key);
      assert_equals(await r.json(), "hello world");
    }, `Check response returned by static json() with init ${JSON.stringify(init)}`);
  }
  for (const status of [204, 205, 304]) {
    test(() => { assert_throws_js(TypeError, () => Response.json("hello world", { status })); },
      `Throws TypeError when calling static json() with a status of ${status}`);
  }
  promise_test(async () => {
    const data = await Response.json({ foo: "bar" }).json();
    assert_equals(typeof data, "object");
    assert_equals(data.foo, "bar");
  }, "Check static json() encodes JSON objects correctly");
  test(() => { assert_throws_js(TypeError, () => Response.json(Symbol("foo"))); },
    "Check static json() throws when data is not encodable");
  test(() => {
    const a = { b: 1 };
    a.a = a;
    assert_throws_js(TypeError, () => Response.json(a));
  }, "Check static json() throws when data is circular");
  promise_test(async () => {
    class CustomError extends Error {
      name = "CustomError";
    }
    assert_throws_js(CustomError, () => Response.json({ get foo() { throw new CustomError("bar"); } }));
  }, "Check static json() propagates JSON serializer errors");
  for (const [input, expected] of [["𝌆", [34, 240, 157, 140, 134, 34]],
    ["\uDF06\uD834", [34, 92, 117, 100, 102, 48, 54, 92, 117, 100, 56, 51, 52, 34]],
    ["\uDEAD", [34, 92, 117, 100, 101, 97, 100, 34]]]) {
    promise_test(async () => {
      assert_array_equals(new Uint8Array(await Response.json(input).arrayBuffer()), expected);
    }, `Check response returned by static json() with input ${input}`);
  }
}

file = "response-static-redirect.any.js";
{
  const url = "http://test.url:1234/";
  test(() => {
    const r = Response.redirect(url);
    assert_equals(r.type, "default");
    assert_false(r.redirected);
    assert_false(r.ok);
    assert_equals(r.status, 302);
    assert_equals(r.headers.get("Location"), url);
    assert_equals(r.statusText, "");
  }, "Check default redirect response");
  for (const status of [301, 302, 303, 307, 308]) {
    test(() => {
      const r = Response.redirect(url, status);
      assert_equals(r.type, "default");
      assert_false(r.redirected);
      assert_false(r.ok);
      assert_equals(r.status, status);
      assert_equals(r.headers.get("Location"), url);
      assert_equals(r.statusText, "");
    }, `Check response returned by static method redirect(), status = ${status}`);
  }
  test(() => { assert_throws_js(TypeError, () => Response.redirect("http://:This is not an url")); },
    "Check error returned when giving invalid url to redirect()");
  for (const status of [200, 309, 400, 500]) {
    test(() => { assert_throws_js(RangeError, () => Response.redirect(url, status)); },
      `Check error returned when giving invalid status to redirect(), status = ${status}`);
  }
}

file = "response-clone.any.js";
{
  const defaults = { type: "default", url: "", ok: true, status: 200, statusText: "" };
  test(() => {
    const clone = new Response().clone();
    for (const attribute in defaults) assert_equals(clone[attribute], defaults[attribute], attribute);
  }, "Check Response's clone with default values, without body");
  const body = "This is response body";
  const init = { status: 200, statusText: "GOOD", headers: { name: "value" } };
  const response = new Response(body, init);
  const clone = response.clone();
  test(() => {
    assert_equals(clone.status, 200);
    assert_equals(clone.statusText, "GOOD");
    assert_equals(clone.headers.get("name"), "value");
  }, "Check Response's clone has the expected attribute values");
  promise_test(() => validateStreamFromString(response.body.getReader(), body), "Check original response's body after cloning");
  promise_test(() => validateStreamFromString(clone.body.getReader(), body), "Check cloned response's body");
  promise_test(async () => {
    const disturbed = new Response("data");
    await disturbed.text();
    assert_true(disturbed.bodyUsed);
    assert_throws_js(TypeError, () => disturbed.clone());
  }, "Cannot clone a disturbed response");
  const testReadableStreamClone = (initial, type) => {
    promise_test(async () => {
      const r = new Response(new ReadableStream({ start(c) { c.enqueue(initial); c.close(); } }));
      const copy = r.clone();
      const stream1 = r.body, stream2 = copy.body;
      const first = await stream1.getReader().read();
      assert_false(first.done);
      assert_equals(first.value, initial, "the original's chunk is the same object");
      const second = await stream2.getReader().read();
      assert_false(second.done);
      if (initial instanceof ArrayBuffer) {
        assert_true(second.value instanceof ArrayBuffer, "an ArrayBuffer");
        assert_array_equals(new Uint8Array(second.value), new Uint8Array(initial));
      } else if (initial instanceof DataView) {
        assert_true(second.value instanceof DataView, "a DataView");
        assert_equals(second.value.byteLength, initial.byteLength);
        assert_equals(second.value.byteOffset, initial.byteOffset);
      } else {
        assert_array_equals(second.value, initial);
      }
      assert_equals(Object.getPrototypeOf(second.value), Object.getPrototypeOf(initial), "the same type");
      assert_not_equals(second.value, initial, "the clone's chunk is a copy");
    }, `Check response clone use structureClone for teed ReadableStreams (${type}chunk)`);
  };
  const buffer = new ArrayBuffer(16);
  testReadableStreamClone(new Int8Array(buffer, 1), "Int8Array");
  testReadableStreamClone(new Int16Array(buffer, 2, 2), "Int16Array");
  testReadableStreamClone(new Int32Array(buffer), "Int32Array");
  testReadableStreamClone(buffer, "ArrayBuffer");
  testReadableStreamClone(new Uint8Array(buffer), "Uint8Array");
  testReadableStreamClone(new Uint8ClampedArray(buffer), "Uint8ClampedArray");
  testReadableStreamClone(new Uint16Array(buffer, 2), "Uint16Array");
  testReadableStreamClone(new Uint32Array(buffer), "Uint32Array");
  testReadableStreamClone(typeof BigInt64Array === "function" ? new BigInt64Array(buffer) : undefined, "BigInt64Array");
  testReadableStreamClone(typeof BigUint64Array === "function" ? new BigUint64Array(buffer) : undefined, "BigUint64Array");
  testReadableStreamClone(typeof Float16Array === "function" ? new Float16Array(buffer) : undefined, "Float16Array");
  testReadableStreamClone(new Float32Array(buffer), "Float32Array");
  testReadableStreamClone(new Float64Array(buffer), "Float64Array");
  testReadableStreamClone(new DataView(buffer, 2, 8), "DataView");
}

file = "response-consume-empty.any.js";
{
  const check = {
    text: async (r) => { assert_equals(await r.text(), ""); assert_false(r.bodyUsed); },
    blob: async (r) => { assert_equals(await (await r.blob()).text(), ""); assert_false(r.bodyUsed); },
    arrayBuffer: async (r) => { assert_equals((await r.arrayBuffer()).byteLength, 0); assert_false(r.bodyUsed); },
    json: (r) => r.json().then(() => assert_unreached("JSON parsing should fail"), () => assert_false(r.bodyUsed)),
    formData: async (r) => { assert_true((await r.formData()) instanceof FormData); assert_false(r.bodyUsed); },
    formDataError: async (r, t) => { await promise_rejects_js(t, TypeError, r.formData()); assert_false(r.bodyUsed); },
  };
  for (const [type, fn, headers = []] of [["text", check.text], ["blob", check.blob], ["arrayBuffer", check.arrayBuffer],
    ["json (error case)", check.json],
    ["formData with correct multipart type (error case)", check.formDataError, [["Content-Type", 'multipart/form-data; boundary="boundary"']]],
    ["formData with correct urlencoded type", check.formData, [["Content-Type", "application/x-www-form-urlencoded;charset=UTF-8"]]],
    ["formData without correct type (error case)", check.formDataError]]) {
    promise_test((t) => {
      const response = new Response(undefined, { headers });
      assert_false(response.bodyUsed);
      return fn(response, t);
    }, `Consume response's body as ${type}`);
  }
  for (const [type, body, asText] of [["blob", () => new Blob([], { type: "text/plain" }), false], ["text", () => "", false],
    ["blob", () => new Blob([], { type: "text/plain" }), true], ["text", () => "", true],
    ["URLSearchParams", () => new URLSearchParams(""), true], ["FormData", () => new FormData(), true],
    ["ArrayBuffer", () => new ArrayBuffer(), true]]) {
    promise_test(async () => {
      const response = new Response(body());
      assert_false(response.bodyUsed, "bodyUsed is false at first");
      if (asText) assert_equals((await response.text()).length, 0);
      else assert_equals((await response.arrayBuffer()).byteLength, 0);
      assert_true(response.bodyUsed, "bodyUsed is true once consumed");
    }, `Consume empty ${type} response body as ${asText ? "text" : "arrayBuffer"}`);
  }
}

file = "response-consume-stream.any.js";
{
  const textData = JSON.stringify("This is response's body");
  promise_test(() => validateStreamFromString(new Response("").body.getReader(), ""),
    "Read empty text response's body as readableStream");
  promise_test(() => validateStreamFromString(new Response(new Blob([], { type: "text/plain" })).body.getReader(), ""),
    "Read empty blob response's body as readableStream");
  for (const mode of [undefined, "byob"]) {
    promise_test(() => validateStreamFromString(new Response(new Blob([textData], { type: "text/plain" })).body.getReader({ mode }), textData),
      `Read blob response's body as readableStream with mode=${mode}`);
    promise_test(() => validateStreamFromString(new Response(textData).body.getReader({ mode }), textData),
      `Read text response's body as readableStream with mode=${mode}`);
    promise_test(() => validateStreamFromString(new Response(new URLSearchParams("name=value")).body.getReader({ mode }), "name=value"),
      `Read URLSearchParams response's body as readableStream with mode=${mode}`);
    promise_test(() => {
      const buffer = new ArrayBuffer(textData.length);
      new Int8Array(buffer).set(stringToArray(textData));
      return validateStreamFromString(new Response(buffer).body.getReader({ mode }), textData);
    }, `Read array buffer response's body as readableStream with mode=${mode}`);
    promise_test(async () => {
      const formData = new FormData();
      formData.append("name", "value");
      const reader = new Response(formData).body.getReader({ mode });
      let text = "";
      for (;;) {
        const { done, value } = await reader.read(new Uint8Array(64));
        if (done) break;
        text += new TextDecoder().decode(value, { stream: true });
      }
      assert_true(text.includes("Content-Disposition: form-data; name=\"name\"\r\n\r\nvalue"));
    }, `Read form data response's body as readableStream with mode=${mode}`);
  }
  test(() => { assert_equals(Response.error().body, null); }, "Getting an error Response stream");
  test(() => { assert_equals(Response.redirect(rel("/")).body, null); }, "Getting a redirect Response stream");
  promise_test(async () => {
    let buffer = new ArrayBuffer(textData.length);
    const reader = new Response(textData).body.getReader({ mode: "byob" });
    let offset = 3;
    while (offset < textData.length) {
      const { done, value } = await reader.read(new Uint8Array(buffer, offset));
      if (done) break;
      buffer = value.buffer;
      offset += value.byteLength;
    }
    validateBufferFromString(buffer, "\0\0\0\"This is response's bo");
  }, "Reading with offset from Response stream");
}

file = "response-from-stream.any.js";
test(() => {
  const stream = new ReadableStream();
  stream.getReader();
  assert_throws_js(TypeError, () => new Response(stream));
}, "Constructing a Response with a stream on which getReader() is called");
test(() => {
  const stream = new ReadableStream();
  stream.getReader().read();
  assert_throws_js(TypeError, () => new Response(stream));
}, "Constructing a Response with a stream on which read() is called");
promise_test(async () => {
  const stream = new ReadableStream({ pull: (c) => c.enqueue(new Uint8Array()) });
  const reader = stream.getReader();
  await reader.read();
  reader.releaseLock();
  assert_throws_js(TypeError, () => new Response(stream));
}, "Constructing a Response with a stream on which read() and releaseLock() are called");

file = "response-error-from-stream.any.js";
{
  const startError = () => {
    const error = new Error("Start error");
    return [new ReadableStream({ start(c) { c.error(error); } }), error];
  };
  const pullError = () => {
    const error = new Error("Pull error");
    return [new ReadableStream({ pull(c) { c.error(error); } }), error];
  };
  promise_test((t) => {
    const [stream, error] = startError();
    return promise_rejects_exactly(t, error, stream.getReader().read());
  }, "ReadableStreamDefaultReader Promise receives ReadableStream start() Error");
  promise_test((t) => {
    const [stream, error] = pullError();
    return promise_rejects_exactly(t, error, stream.getReader().read());
  }, "ReadableStreamDefaultReader Promise receives ReadableStream pull() Error");
  for (const [make, kind] of [[startError, "start"], [pullError, "pull"]]) {
    for (const method of ["arrayBuffer", "blob", "bytes", "formData", "json", "text"]) {
      promise_test((t) => {
        const [stream, error] = make();
        return promise_rejects_exactly(t, error, new Response(stream)[method]());
      }, `ReadableStream ${kind}() Error propagates to Response.${method}() Promise`);
    }
  }
}

file = "response-stream-bad-chunk.any.js";
for (const method of ["arrayBuffer", "blob", "bytes", "formData", "json", "text"]) {
  promise_test((t) => {
    const stream = new ReadableStream({ start(c) { c.enqueue("not Uint8Array"); c.close(); } });
    return promise_rejects_js(t, TypeError, new Response(stream)[method]());
  }, `ReadableStream with non-Uint8Array chunk passed to Response.${method}() causes TypeError`);
}

file = "response-cancel-stream.any.js";
promise_test(() => new Response(new Blob([], { type: "text/plain" })).body.cancel(), "Cancelling a starting blob Response stream");
promise_test(() => {
  const reader = new Response(new Blob(["This is data"], { type: "text/plain" })).body.getReader();
  reader.read();
  return reader.cancel();
}, "Cancelling a loading blob Response stream");
promise_test(() => {
  const reader = new Response(new Blob(["T"], { type: "text/plain" })).body.getReader();
  const closed = reader.closed.then(() => reader.cancel());
  reader.read().then(function more({ done }) { if (!done) return reader.read().then(more); });
  return closed;
}, "Cancelling a closed blob Response stream");

// response-stream-disturbed-1 to -5: bodies from a stream and from a string (the originals also fetch one).
const DISTURBED_BODY = '{"key": "value"}';
const responseFromBodySource = (source) => (source === "stream"
  ? new Response(new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode(DISTURBED_BODY)); c.close(); } }))
  : new Response(DISTURBED_BODY));
file = "response-stream-disturbed-1.any.js";
for (const source of ["stream", "string"]) {
  const unlocked = () => {
    const response = responseFromBodySource(source);
    response.body.getReader().releaseLock();
    return response;
  };
  promise_test(async () => { assert_true((await unlocked().blob()) instanceof Blob); },
    `Getting blob after getting the Response body - not disturbed, not locked (body source: ${source})`);
  promise_test(async () => { assert_true((await unlocked().text()).length > 0); },
    `Getting text after getting the Response body - not disturbed, not locked (body source: ${source})`);
  promise_test(async () => { assert_equals(typeof (await unlocked().json()), "object"); },
    `Getting json after getting the Response body - not disturbed, not locked (body source: ${source})`);
  promise_test(async () => { assert_true((await unlocked().arrayBuffer()).byteLength > 0); },
    `Getting arrayBuffer after getting the Response body - not disturbed, not locked (body source: ${source})`);
}
for (const [n, what, prepare] of [
  [2, "getting a locked Response body", (r) => { r.body.getReader(); }],
  [3, "reading the Response body", (r) => { r.body.getReader().read(); }],
  [4, "cancelling the Response body", (r) => { r.body.cancel(); }],
]) {
  file = `response-stream-disturbed-${n}.any.js`;
  for (const source of ["stream", "string"]) {
    for (const method of ["blob", "text", "json", "arrayBuffer"]) {
      promise_test((t) => {
        const response = responseFromBodySource(source);
        prepare(response);
        return promise_rejects_js(t, TypeError, response[method]());
      }, `Getting ${method} after ${what} (body source: ${source})`);
    }
  }
}
file = "response-stream-disturbed-5.any.js";
for (const source of ["stream", "string"]) {
  for (const method of ["blob", "text", "json", "arrayBuffer"]) {
    promise_test(async () => {
      const response = responseFromBodySource(source);
      response[method]().catch(() => {});
      assert_not_equals(response.body, null);
      assert_throws_js(TypeError, () => response.body.getReader());
    }, `Getting a body reader after consuming as ${method} (body source: ${source})`);
  }
}

file = "response-stream-disturbed-6.any.js";
for (const [what, start, act] of [
  ["A non-closed stream on which read() has been called", undefined, (reader) => reader.read()],
  ["A non-closed stream on which cancel() has been called", undefined, (reader) => reader.cancel()],
  ["A closed stream on which read() has been called", (c) => c.close(), (reader) => reader.read()],
  ["An errored stream on which read() has been called", (c) => c.error(new Error("some error")),
    (reader) => reader.read().then(() => {}, () => {})],
  ["An errored stream on which cancel() has been called", (c) => c.error(new Error("some error")),
    (reader) => reader.cancel().then(() => {}, () => {})],
]) {
  test(() => {
    const stream = new ReadableStream(start ? { start } : undefined);
    const response = new Response(stream);
    assert_false(response.bodyUsed, "at first");
    const reader = stream.getReader();
    assert_false(response.bodyUsed, "once it has a reader");
    act(reader);
    assert_true(response.bodyUsed, "once read or cancelled");
  }, what);
}

file = "response-stream-disturbed-by-pipe.any.js";
test(() => {
  const r = new Response(new ReadableStream());
  r.body.pipeTo(new WritableStream({}, { highWaterMark: 0 }));
  assert_true(r.bodyUsed);
}, "using pipeTo on Response body should disturb it synchronously");
test(() => {
  const r = new Response(new ReadableStream());
  r.body.pipeThrough({ writable: new WritableStream({}, { highWaterMark: 0 }), readable: new ReadableStream() });
  assert_true(r.bodyUsed);
}, "using pipeThrough on Response body should disturb it synchronously");

file = "response-init-contenttype.any.js";
{
  const OVERRIDE = "test/only; mime=type";
  const bodies = [["empty body", () => undefined, null], ["Blob body (no type set)", () => new Blob([]), null],
    ["Blob body (empty type)", () => new Blob([], { type: "" }), null],
    ["Blob body (set type)", () => new Blob([], { type: "a/b; c=d" }), "a/b; c=d"],
    ["buffer source body", () => new Uint8Array(), null],
    ["URLSearchParams body", () => new URLSearchParams(), "application/x-www-form-urlencoded;charset=UTF-8"],
    ["string body", () => "", "text/plain;charset=UTF-8"], ["ReadableStream body", () => new ReadableStream(), null]];
  for (const [what, body, expected] of bodies.slice(0, 5)) {
    test(() => { assert_equals(new Response(body()).headers.get("Content-Type"), expected); }, `Default Content-Type for Response with ${what}`);
  }
  promise_test(async () => {
    const formData = new FormData();
    formData.append("a", "b");
    const response = new Response(formData);
    const boundary = (await response.text()).split("\r\n")[0].slice(2);
    assert_equals(response.headers.get("Content-Type"), `multipart/form-data; boundary=${boundary}`);
  }, "Default Content-Type for Response with FormData body");
  for (const [what, body, expected] of bodies.slice(5)) {
    test(() => { assert_equals(new Response(body()).headers.get("Content-Type"), expected); }, `Default Content-Type for Response with ${what}`);
  }
  bodies.splice(5, 0, ["FormData body", () => new FormData()]);
  for (const [what, body] of bodies) {
    test(() => {
      assert_equals(new Response(body(), { headers: { "Content-Type": OVERRIDE } }).headers.get("Content-Type"), OVERRIDE);
    }, `Can override Content-Type for Response with ${what}`);
  }
}

// --- FileAPI/blob (the Blob that bodies are read as and made of) ----------------------------------------------

file = "Blob-text.any.js";
const utf8 = (text) => new TextEncoder().encode(text);
const INVALID_UTF8 = [192, 193, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255];
promise_test(async () => { assert_equals(await new Blob(["PASS"]).text(), "PASS"); }, "Blob.text()");
promise_test(async () => { assert_equals(await new Blob().text(), ""); }, "Blob.text() empty blob data");
promise_test(async () => { assert_equals(await new Blob(["P", "A", "SS"]).text(), "PASS"); },
  "Blob.text() multi-element array in constructor");
promise_test(async () => { assert_equals(await new Blob([utf8("\u0061\u030A")]).text(), "\u0061\u030A"); },
  "Blob.text() non-unicode");
promise_test(async () => {
  assert_equals(await new Blob(["PASS"], { type: "text/plain;charset=utf-16le" }).text(), "PASS");
}, "Blob.text() different charset param in type option");
promise_test(async () => {
  const blob = new Blob([utf8("\u0061\u030A")], { type: "text/plain;charset=utf-16le" });
  assert_equals(await blob.text(), "\u0061\u030A");
}, "Blob.text() different charset param with non-ascii input");
promise_test(async () => {
  assert_equals(await new Blob([new Uint8Array(INVALID_UTF8)]).text(), "\ufffd".repeat(13));
}, "Blob.text() invalid utf-8 input");
promise_test(async () => {
  const blob = new Blob([new Uint8Array(INVALID_UTF8)]);
  for (const text of await Promise.all([blob.text(), blob.text(), blob.text()])) assert_equals(text, "\ufffd".repeat(13));
}, "Blob.text() concurrent reads");

// Blob-array-buffer.any.js and Blob-bytes.any.js: the same cases, read as an ArrayBuffer and as bytes.
const assert_equals_typed_array = (a, b) => {
  assert_equals(a.byteLength, b.byteLength, "byte lengths");
  const x = new Uint8Array(a.buffer, a.byteOffset, a.byteLength), y = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  for (let i = 0; i < x.length; i++) assert_equals(x[i], y[i], `byte ${i}`);
};
for (const [name, read, title] of [["Blob-array-buffer.any.js", (b) => b.arrayBuffer().then((a) => {
  assert_true(a instanceof ArrayBuffer, "an ArrayBuffer");
  return new Uint8Array(a);
}), "Blob.arrayBuffer()"], ["Blob-bytes.any.js", (b) => b.bytes().then((u) => {
  assert_true(u instanceof Uint8Array, "a Uint8Array");
  return u;
}), "Blob.bytes()"]]) {
  file = name;
  promise_test(async () => { assert_equals_typed_array(await read(new Blob([utf8("PASS")])), utf8("PASS")); }, title);
  promise_test(async () => { assert_equals_typed_array(await read(new Blob([utf8("")])), utf8("")); },
    `${title} empty Blob data`);
  promise_test(async () => {
    assert_equals_typed_array(await read(new Blob([utf8("\u08B8\u000a")])), utf8("\u08B8\u000a"));
  }, `${title} non-ascii input`);
  promise_test(async () => {
    const bytes = new Uint8Array([8, 241, 48, 123, 151]);
    assert_equals_typed_array(await read(new Blob([bytes])), bytes);
  }, `${title} non-unicode input`);
  promise_test(async () => {
    const blob = new Blob([utf8("PASS")]);
    for (const bytes of await Promise.all([read(blob), read(blob), read(blob)])) assert_equals_typed_array(bytes, utf8("PASS"));
  }, `${title} concurrent reads`);
}

file = "Blob-slice.any.js";
{
  const test_blob = (fn, { expected, type, desc }) => {
    promise_test(async () => {
      const blob = fn();
      assert_true(blob instanceof Blob);
      assert_false(blob instanceof File);
      assert_equals(blob.type, type);
      assert_equals(blob.size, expected.length);
      assert_equals(await blob.text(), expected);
    }, desc);
  };
  test_blob(() => new Blob(["PASS"]).slice(), { expected: "PASS", type: "", desc: "no-argument Blob slice" });
  const blob1 = new Blob(["squiggle"]);
  const blob2 = new Blob(["steak"], { type: "content/type" });
  test_blob(() => blob1, { expected: "squiggle", type: "", desc: "blob1." });
  test_blob(() => blob2, { expected: "steak", type: "content/type", desc: "blob2." });
  test_blob(() => new Blob(["abcd"]).slice(undefined, undefined, "content/type"),
    { expected: "abcd", type: "content/type", desc: "undefined start/end Blob slice" });
  test_blob(() => new Blob(["abcd"]).slice(undefined, 2, "content/type"),
    { expected: "ab", type: "content/type", desc: "undefined start Blob slice" });
  test_blob(() => new Blob(["abcd"]).slice(2, undefined, "content/type"),
    { expected: "cd", type: "content/type", desc: "undefined end Blob slice" });
  test_blob(() => new Blob().slice(0, 0, null), { expected: "", type: "null", desc: "null type Blob slice" });
  test_blob(() => new Blob().slice(0, 0, undefined), { expected: "", type: "", desc: "undefined type Blob slice" });
  test_blob(() => new Blob().slice(0, 0), { expected: "", type: "", desc: "no type Blob slice" });
  const arrayBuffer = new ArrayBuffer(16);
  const int8View = new Int8Array(arrayBuffer);
  for (let i = 0; i < 16; i++) int8View[i] = i + 65;
  const slices = [
    [["PASSSTRING"], [[-6, undefined, "STRING"], [-12, undefined, "PASSSTRING"], [4, undefined, "STRING"],
      [12, undefined, ""], [0, -6, "PASS"], [0, -12, ""], [0, 4, "PASS"], [0, 12, "PASSSTRING"], [7, 4, ""]]],
    [["abcd"], [[0.5, undefined, "abcd"], [1.5, undefined, "cd"], [2.5, undefined, "cd"], [3.5, undefined, ""],
      [0, 0.5, ""], [0, 1.5, "ab"], [0, 2.5, "ab"], [0, 3.5, "abcd"], [1.5, 2.5, ""], [1.5, 3.5, "cd"]]],
    [["foo", "bar", "baz"], [[0, 9, "foobarbaz"], [0, 3, "foo"], [3, 9, "barbaz"], [6, 9, "baz"], [6, 12, "baz"],
      [0, 9, "foobarbaz"], [0, 11, "foobarbaz"], [10, 15, ""]]],
    [["foo", blob1, "baz"], [[0, 3, "foo"], [3, 11, "squiggle"], [2, 4, "os"], [10, 12, "eb"]]],
    [[blob1, "foo", blob1], [[0, 8, "squiggle"], [7, 9, "ef"], [10, 12, "os"], [1, 4, "qui"], [12, 15, "qui"],
      [40, 60, ""]]],
    [[blob2, blob1, blob2], [[0, 5, "steak"], [5, 13, "squiggle"], [13, 18, "steak"], [1, 3, "te"], [6, 10, "quig"]]],
    [[int8View, blob1, "foo"], [[0, 8, "ABCDEFGH"], [8, 18, "IJKLMNOPsq"], [17, 20, "qui"], [4, 12, "EFGHIJKL"]]],
    [[new Uint8Array(arrayBuffer, 3, 5), blob1, "foo"], [[0, 8, "DEFGHsqu"], [8, 18, "igglefoo"], [4, 12, "Hsquiggl"]]],
    [[3, int8View, "foo"], [[0, 8, "3ABCDEFG"], [8, 18, "HIJKLMNOPf"], [17, 21, "foo"], [4, 12, "DEFGHIJK"]]],
    [[new Uint8Array([0, 255, 0]).buffer, new Blob(["abcd"]), "efgh", "ijklmnopqrstuvwxyz"],
      [[1, 4, "\uFFFD\u0000a"], [4, 8, "bcde"], [8, 12, "fghi"], [1, 12, "\uFFFD\u0000abcdefghi"]]],
  ];
  slices.forEach(([parts, cases], i) => {
    cases.forEach(([start, end, contents], j) => {
      test_blob(() => {
        const blob = new Blob(parts);
        assert_true(blob instanceof Blob);
        assert_false(blob instanceof File);
        return end === undefined ? blob.slice(start) : blob.slice(start, end);
      }, { expected: contents, type: "", desc: `Slicing test: slice (${i},${j}).` });
    });
  });
  for (const type of ["\xFF", "te\x09xt/plain", "te\x00xt/plain", "te\x1Fxt/plain", "te\x7Fxt/plain"]) {
    test_blob(() => new Blob(["PASS"]).slice(0, 4, type),
      { expected: "PASS", type: "", desc: `Invalid contentType (${JSON.stringify(type)})` });
  }
  for (const type of ["te(xt/plain", "te)xt/plain", "te<xt/plain", "te>xt/plain", "te@xt/plain", "te,xt/plain",
    "te;xt/plain", "te:xt/plain", "te\\xt/plain", "te\"xt/plain", "te/xt/plain", "te[xt/plain", "te]xt/plain",
    "te?xt/plain", "te=xt/plain", "te{xt/plain", "te}xt/plain", "te\x20xt/plain", "TEXT/PLAIN",
    "text/plain;charset = UTF-8", "text/plain;charset=UTF-8"]) {
    test_blob(() => new Blob(["PASS"]).slice(0, 4, type),
      { expected: "PASS", type: type.toLowerCase(), desc: `Valid contentType (${JSON.stringify(type)})` });
  }
}

file = "json.any.js";
promise_test(async () => {
  const json = await new Response(`\uFEFF{ "b": 1, "a": 2, "b": 3 }`).json();
  assert_array_equals(Object.keys(json), ["b", "a"]);
  assert_equals(json.a, 2);
  assert_equals(json.b, 3);
}, "Ensure the correct JSON parser is used");
promise_test((t) => {
  // UTF-16LE with its BOM: { "a": 1 }
  const bytes = new Uint8Array([0xff, 0xfe, ...[..."{\"a\":1}"].flatMap((c) => [c.charCodeAt(0), 0])]);
  return promise_rejects_js(t, SyntaxError, new Response(bytes).json());
}, "Ensure UTF-16 results in an error");
}

export default {
  async fetch(request) {
    const path = new URL(request.url).pathname.replace(/^.*\//, "/");
    if (path === "/wpt") {
      cases.length = 0;
      names.clear();
      defineCases();
      return Response.json(await runAll());
    }
    return new Response("not found\n", { status: 404 });
  },
};
