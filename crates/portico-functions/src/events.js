// DOMException, Event, CustomEvent, EventTarget, AbortController and AbortSignal, as the WHATWG DOM and WebIDL
// standards define them (a target without a tree: dispatch reaches the target itself, as on a server). Evaluated
// once per runtime, after prelude.js, whose code throws these DOMExceptions when it runs.
(() => {
  "use strict";
  const define = (name, value) =>
    Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });
  const required = (given, count, what) => {
    if (given < count) throw new TypeError(`${what}: ${count} argument${count > 1 ? "s" : ""} required, but only ${given} present`);
  };
  const isObject = (value) => value !== null && (typeof value === "object" || typeof value === "function");
  // As WebIDL lays out an interface: members enumerable, a @@toStringTag, constants on both the class and its
  // prototype.
  const webidl = (Class, name, constants = {}) => {
    const prototype = Class.prototype;
    for (const key of Object.getOwnPropertyNames(prototype)) {
      if (key !== "constructor") Object.defineProperty(prototype, key, { enumerable: true });
    }
    for (const [key, value] of Object.entries(constants)) {
      const constant = { value, enumerable: true, writable: false, configurable: false };
      Object.defineProperty(Class, key, constant);
      Object.defineProperty(prototype, key, constant);
    }
    Object.defineProperty(prototype, Symbol.toStringTag, { value: name, configurable: true });
    define(name, Class);
  };

  // ---- DOMException ----

  // The legacy codes (the names after TimeoutError have none: 0).
  const NAMES = [
    ["IndexSizeError", "INDEX_SIZE_ERR"], ["DOMStringSizeError", "DOMSTRING_SIZE_ERR"],
    ["HierarchyRequestError", "HIERARCHY_REQUEST_ERR"], ["WrongDocumentError", "WRONG_DOCUMENT_ERR"],
    ["InvalidCharacterError", "INVALID_CHARACTER_ERR"], ["NoDataAllowedError", "NO_DATA_ALLOWED_ERR"],
    ["NoModificationAllowedError", "NO_MODIFICATION_ALLOWED_ERR"], ["NotFoundError", "NOT_FOUND_ERR"],
    ["NotSupportedError", "NOT_SUPPORTED_ERR"], ["InUseAttributeError", "INUSE_ATTRIBUTE_ERR"],
    ["InvalidStateError", "INVALID_STATE_ERR"], ["SyntaxError", "SYNTAX_ERR"],
    ["InvalidModificationError", "INVALID_MODIFICATION_ERR"], ["NamespaceError", "NAMESPACE_ERR"],
    ["InvalidAccessError", "INVALID_ACCESS_ERR"], ["ValidationError", "VALIDATION_ERR"],
    ["TypeMismatchError", "TYPE_MISMATCH_ERR"], ["SecurityError", "SECURITY_ERR"], ["NetworkError", "NETWORK_ERR"],
    ["AbortError", "ABORT_ERR"], ["URLMismatchError", "URL_MISMATCH_ERR"], ["QuotaExceededError", "QUOTA_EXCEEDED_ERR"],
    ["TimeoutError", "TIMEOUT_ERR"], ["InvalidNodeTypeError", "INVALID_NODE_TYPE_ERR"], ["DataCloneError", "DATA_CLONE_ERR"],
  ];
  const CODES = new Map(NAMES.map(([name], i) => [name, i + 1]));
  const CONSTANTS = Object.fromEntries(NAMES.map(([, constant], i) => [constant, i + 1]));

  class DOMException extends Error {
    #name;
    #message;
    #code;
    constructor(message = undefined, options = undefined) {
      super();
      this.#message = message === undefined ? "" : `${message}`;
      if (isObject(options)) {
        this.#name = options.name === undefined ? "Error" : `${options.name}`;
        if ("cause" in options) {
          Object.defineProperty(this, "cause", { value: options.cause, writable: true, configurable: true, enumerable: false });
        }
      } else {
        this.#name = options === undefined ? "Error" : `${options}`;
      }
      this.#code = CODES.get(this.#name) ?? 0;
    }
    get name() { return this.#name; }
    get message() { return this.#message; }
    get code() { return this.#code; }
  }
  webidl(DOMException, "DOMException", CONSTANTS);

  // ---- Event, CustomEvent ----

  const PHASES = { NONE: 0, CAPTURING_PHASE: 1, AT_TARGET: 2, BUBBLING_PHASE: 3 };
  const clock = () => (typeof performance === "object" && performance !== null ? performance.now() : Date.now());
  const TRUSTED = Symbol("trusted");
  // Set in Event's static block: what dispatch needs of an event's private state.
  let eventState;

  class Event {
    #type;
    #bubbles;
    #cancelable;
    #composed;
    #trusted = false;
    #timeStamp = clock();
    #target = null;
    #currentTarget = null;
    #phase = 0;
    #dispatching = false;
    #stop = false;
    #stopImmediately = false;
    #canceled = false;
    #inPassiveListener = false;

    constructor(type, init = undefined) {
      required(arguments.length, 1, "Failed to construct 'Event'");
      this.#type = `${type}`;
      if (init !== undefined && init !== null && !isObject(init)) {
        throw new TypeError("Failed to construct 'Event': the options are not an object");
      }
      this.#bubbles = Boolean(init?.bubbles);
      this.#cancelable = Boolean(init?.cancelable);
      this.#composed = Boolean(init?.composed);
      if (init?.[TRUSTED] === true) this.#trusted = true;
    }
    get type() { return this.#type; }
    get target() { return this.#target; }
    get srcElement() { return this.#target; }
    get currentTarget() { return this.#currentTarget; }
    composedPath() { return this.#dispatching && this.#currentTarget !== null ? [this.#currentTarget] : []; }
    get eventPhase() { return this.#phase; }
    stopPropagation() { this.#stop = true; }
    get cancelBubble() { return this.#stop; }
    set cancelBubble(value) { if (value) this.#stop = true; }
    stopImmediatePropagation() { this.#stop = this.#stopImmediately = true; }
    get bubbles() { return this.#bubbles; }
    get cancelable() { return this.#cancelable; }
    get returnValue() { return !this.#canceled; }
    set returnValue(value) { if (!value) this.preventDefault(); }
    preventDefault() { if (this.#cancelable && !this.#inPassiveListener) this.#canceled = true; }
    get defaultPrevented() { return this.#canceled; }
    get composed() { return this.#composed; }
    get isTrusted() { return this.#trusted; }
    get timeStamp() { return this.#timeStamp; }
    initEvent(type, bubbles = false, cancelable = false) {
      required(arguments.length, 1, "Failed to execute 'initEvent' on 'Event'");
      if (this.#dispatching) return;
      this.#type = `${type}`;
      this.#bubbles = Boolean(bubbles);
      this.#cancelable = Boolean(cancelable);
      this.#stop = this.#stopImmediately = this.#canceled = false;
      this.#target = null;
    }

    static {
      eventState = {
        isEvent: (event) => isObject(event) && #type in event,
        dispatching: (event) => event.#dispatching,
        begin: (event, target) => {
          event.#dispatching = true;
          event.#target = event.#currentTarget = target;
          event.#phase = PHASES.AT_TARGET;
        },
        stoppedImmediately: (event) => event.#stopImmediately,
        passive: (event, on) => { event.#inPassiveListener = on; },
        end: (event) => {
          event.#dispatching = false;
          event.#currentTarget = null;
          event.#phase = PHASES.NONE;
          event.#stop = event.#stopImmediately = false;
          return !event.#canceled;
        },
      };
    }
  }
  webidl(Event, "Event", PHASES);

  class CustomEvent extends Event {
    #detail;
    constructor(type, init = undefined) {
      required(arguments.length, 1, "Failed to construct 'CustomEvent'");
      super(type, init);
      this.#detail = init?.detail ?? null;
    }
    get detail() { return this.#detail; }
    initCustomEvent(type, bubbles = false, cancelable = false, detail = null) {
      required(arguments.length, 1, "Failed to execute 'initCustomEvent' on 'CustomEvent'");
      if (eventState.dispatching(this)) return;
      this.initEvent(type, bubbles, cancelable);
      this.#detail = detail;
    }
  }
  webidl(CustomEvent, "CustomEvent");

  // ---- EventTarget ----

  // An exception thrown by a listener does not stop the dispatch: it is logged, as a browser reports it.
  const report = (error) => {
    try {
      globalThis.console?.error?.("Uncaught (in event listener)", error);
    } catch {
      // nothing more to do
    }
  };
  const flatten = (options) => (isObject(options) ? Boolean(options.capture) : Boolean(options));

  class EventTarget {
    // type -> [{ callback, capture, once, passive, removed }]
    #listeners = new Map();

    constructor() {}

    addEventListener(type, callback, options = undefined) {
      required(arguments.length, 2, "Failed to execute 'addEventListener' on 'EventTarget'");
      type = `${type}`;
      if (callback !== null && callback !== undefined && !isObject(callback)) {
        throw new TypeError("Failed to execute 'addEventListener' on 'EventTarget': the listener is not an object");
      }
      const capture = flatten(options);
      let once = false, passive = false, signal = null;
      if (isObject(options)) {
        once = Boolean(options.once);
        passive = Boolean(options.passive);
        if (options.signal !== undefined) {
          signal = options.signal;
          if (!abortState.isSignal(signal)) {
            throw new TypeError("Failed to execute 'addEventListener' on 'EventTarget': the signal is not an AbortSignal");
          }
        }
      }
      if (callback === null || callback === undefined) return;
      if (signal !== null && signal.aborted) return;
      let list = this.#listeners.get(type);
      if (list === undefined) this.#listeners.set(type, (list = []));
      if (list.some((l) => l.callback === callback && l.capture === capture)) return;
      const listener = { callback, capture, once, passive, removed: false };
      list.push(listener);
      if (signal !== null) abortState.onAbort(signal, () => this.#remove(type, listener));
    }

    removeEventListener(type, callback, options = undefined) {
      required(arguments.length, 2, "Failed to execute 'removeEventListener' on 'EventTarget'");
      type = `${type}`;
      const capture = flatten(options);
      const listener = this.#listeners.get(type)?.find((l) => l.callback === callback && l.capture === capture);
      if (listener !== undefined) this.#remove(type, listener);
    }

    #remove(type, listener) {
      listener.removed = true;
      const list = this.#listeners.get(type);
      if (list === undefined) return;
      const kept = list.filter((l) => l !== listener);
      if (kept.length) this.#listeners.set(type, kept);
      else this.#listeners.delete(type);
    }

    dispatchEvent(event) {
      required(arguments.length, 1, "Failed to execute 'dispatchEvent' on 'EventTarget'");
      if (!eventState.isEvent(event)) {
        throw new TypeError("Failed to execute 'dispatchEvent' on 'EventTarget': the argument is not an Event");
      }
      if (eventState.dispatching(event)) throw new DOMException("The event is already being dispatched.", "InvalidStateError");
      eventState.begin(event, this);
      // The listeners as they were when the dispatch began (a removed one is skipped); at the target, the
      // capturing ones first.
      const list = this.#listeners.get(event.type) ?? [];
      for (const capturing of [true, false]) {
        for (const listener of list) {
          if (listener.removed || listener.capture !== capturing) continue;
          if (listener.once) this.#remove(event.type, listener);
          if (listener.passive) eventState.passive(event, true);
          try {
            const callback = listener.callback;
            if (typeof callback === "function") callback.call(this, event);
            else {
              const handleEvent = callback.handleEvent;
              if (typeof handleEvent !== "function") throw new TypeError("the listener's handleEvent is not a function");
              handleEvent.call(callback, event);
            }
          } catch (error) {
            report(error);
          }
          if (listener.passive) eventState.passive(event, false);
          if (eventState.stoppedImmediately(event)) break;
        }
        if (eventState.stoppedImmediately(event)) break;
      }
      return eventState.end(event);
    }
  }
  webidl(EventTarget, "EventTarget");
  const addListener = EventTarget.prototype.addEventListener;
  const dispatch = EventTarget.prototype.dispatchEvent;

  // ---- AbortSignal, AbortController ----

  const CREATE = Symbol("create");
  const abortError = () => new DOMException("The signal has been aborted", "AbortError");
  // Set in AbortSignal's static block.
  let abortState;

  class AbortSignal extends EventTarget {
    #aborted = false;
    #reason = undefined;
    #onabort = null;
    #onabortListening = false;
    // What runs before the abort event: listeners with this signal, dependent signals' sources.
    #algorithms = [];
    // AbortSignal.any's: the signals it follows (strongly), and the signals that follow this one (weakly,
    // so that a long-lived signal does not keep each request's).
    #dependent = false;
    #sources = null;
    #dependents = null;

    constructor(token = undefined) {
      if (token !== CREATE) throw new TypeError("Illegal constructor");
      super();
    }
    get aborted() { return this.#aborted; }
    get reason() { return this.#reason; }
    throwIfAborted() { if (this.#aborted) throw this.#reason; }
    get onabort() { return this.#onabort; }
    set onabort(handler) {
      this.#onabort = isObject(handler) ? handler : null;
      if (!this.#onabortListening) {
        this.#onabortListening = true;
        addListener.call(this, "abort", (event) => {
          const h = this.#onabort;
          if (typeof h === "function") h.call(this, event);
        });
      }
    }

    static abort(reason = undefined) {
      const signal = new AbortSignal(CREATE);
      signal.#aborted = true;
      signal.#reason = reason === undefined ? abortError() : reason;
      return signal;
    }

    // Needs timers: a NotSupportedError where the runtime has no setTimeout.
    static timeout(milliseconds) {
      required(arguments.length, 1, "Failed to execute 'timeout' on 'AbortSignal'");
      const ms = Number(milliseconds);
      if (!Number.isFinite(ms) || ms < 0 || ms > Number.MAX_SAFE_INTEGER) {
        throw new TypeError(`Failed to execute 'timeout' on 'AbortSignal': ${milliseconds} is outside the range of milliseconds`);
      }
      if (typeof globalThis.setTimeout !== "function") {
        throw new DOMException("AbortSignal.timeout needs setTimeout, which this runtime does not have", "NotSupportedError");
      }
      const signal = new AbortSignal(CREATE);
      globalThis.setTimeout(() => AbortSignal.#abort(signal, new DOMException("The signal timed out.", "TimeoutError")), Math.trunc(ms));
      return signal;
    }

    static any(signals) {
      required(arguments.length, 1, "Failed to execute 'any' on 'AbortSignal'");
      const list = [];
      for (const signal of signals) {
        if (!(isObject(signal) && #aborted in signal)) {
          throw new TypeError("Failed to execute 'any' on 'AbortSignal': an item is not an AbortSignal");
        }
        list.push(signal);
      }
      const result = new AbortSignal(CREATE);
      for (const signal of list) {
        if (signal.#aborted) {
          result.#aborted = true;
          result.#reason = signal.#reason;
          return result;
        }
      }
      result.#dependent = true;
      result.#sources = new Set();
      const follow = (source) => {
        if (result.#sources.has(source)) return;
        result.#sources.add(source);
        (source.#dependents ??= new Set()).add(new WeakRef(result));
      };
      for (const signal of list) {
        if (signal.#dependent) for (const source of signal.#sources) follow(source);
        else follow(signal);
      }
      return result;
    }

    static #abort(signal, reason) {
      if (signal.#aborted) return;
      signal.#aborted = true;
      signal.#reason = reason === undefined ? abortError() : reason;
      const followers = [];
      if (signal.#dependents !== null) {
        for (const ref of signal.#dependents) {
          const dependent = ref.deref();
          if (dependent !== undefined && !dependent.#aborted) {
            dependent.#aborted = true;
            dependent.#reason = signal.#reason;
            followers.push(dependent);
          }
        }
        signal.#dependents = null;
      }
      signal.#runAbortSteps();
      for (const dependent of followers) dependent.#runAbortSteps();
    }

    #runAbortSteps() {
      const algorithms = this.#algorithms;
      this.#algorithms = [];
      for (const algorithm of algorithms) {
        try {
          algorithm();
        } catch (error) {
          report(error);
        }
      }
      dispatch.call(this, new Event("abort", { [TRUSTED]: true }));
    }

    static {
      abortState = {
        isSignal: (value) => isObject(value) && #aborted in value,
        onAbort: (signal, algorithm) => { if (!signal.#aborted) signal.#algorithms.push(algorithm); },
        abort: (signal, reason) => AbortSignal.#abort(signal, reason),
      };
    }
  }
  webidl(AbortSignal, "AbortSignal");

  class AbortController {
    #signal = new AbortSignal(CREATE);
    get signal() { return this.#signal; }
    abort(reason = undefined) { abortState.abort(this.#signal, reason); }
  }
  webidl(AbortController, "AbortController");
})();
