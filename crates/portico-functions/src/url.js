// URL and URLSearchParams as the WHATWG URL Standard defines them: the classes are native (url_class.rs, on
// url.rs's parsing: the `url` crate's parser, setters and form-urlencoded code, with a fast path for the
// absolute http(s) URLs a handler parses on every request). What is left here is what runs a handler's code
// or needs a symbol: the conversion of an object given to `new URLSearchParams(init)` (a sequence of pairs or
// a record), the @@toStringTag and @@iterator properties, the iterator's prototype chain, and the globals. A
// module evaluated once per runtime, whose default export webapi.rs calls with the natives, which stay out of
// the handler's reach.
export default (native) => {
  const { URL, URLSearchParams, iteratorPrototype, setPairsOf } = native;
  // WebIDL's USVString: a symbol is a TypeError, lone surrogates become U+FFFD.
  const usv = (value) => (typeof value === "string" ? value : `${value}`).toWellFormed();

  // An object init as [name, value, name, value, ...]: a sequence of pairs when it has @@iterator, else a
  // record (own enumerable keys, in order; a key seen twice after USVString conversion keeps its first place
  // and takes its last value).
  setPairsOf((init) => {
    const list = [];
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
        list.push(usv(items[0]), usv(items[1]));
      }
      return list;
    }
    const at = new Map();
    for (const key of Reflect.ownKeys(init)) {
      const descriptor = Reflect.getOwnPropertyDescriptor(init, key);
      if (descriptor === undefined || !descriptor.enumerable) continue;
      const name = usv(key), value = usv(init[key]);
      const i = at.get(name);
      if (i === undefined) {
        at.set(name, list.length);
        list.push(name, value);
      } else list[i + 1] = value;
    }
    return list;
  });

  // As WebIDL lays out an interface (the natives made the members enumerable): a @@toStringTag, @@iterator
  // the same function as entries, the iterator's prototype on %IteratorPrototype%; the globals writable,
  // configurable and not enumerable.
  const tag = (object, name) => Object.defineProperty(object, Symbol.toStringTag, { value: name, configurable: true });
  tag(URL.prototype, "URL");
  tag(URLSearchParams.prototype, "URLSearchParams");
  Object.defineProperty(URLSearchParams.prototype, Symbol.iterator, {
    value: URLSearchParams.prototype.entries, writable: true, configurable: true,
  });
  Object.setPrototypeOf(iteratorPrototype, Object.getPrototypeOf(Object.getPrototypeOf([][Symbol.iterator]())));
  tag(iteratorPrototype, "URLSearchParams Iterator");
  for (const Class of [URL, URLSearchParams]) {
    Object.defineProperty(globalThis, Class.name, { value: Class, writable: true, configurable: true, enumerable: false });
  }
};
