"""Generate the Objective-C stub headers that let clang type-check `native/mpsgraph` on Linux.

Input: PyObjC's SDK metadata (`arm64-26.5.fwinfo` per framework; see
`../shared/mpsgraph-metadata/README.md`). Output: `native/mpsgraph/stubs/`, a tiny fake SDK with
`Foundation/Foundation.h`, `Metal/Metal.h`, `MetalPerformanceShaders/MetalPerformanceShaders.h`
and `MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h`, every method carrying its
macOS availability, so `clang -fsyntax-only -target arm64-apple-macos14.0
-Werror=unguarded-availability-new` catches misspelled selectors, wrong argument types and
unguarded calls to newer methods, as Xcode would.

Every MPSGraph class is emitted whole; from the other frameworks only the classes and protocols
that MPSGraph's signatures or the host code use (the selection below), and of their methods only
those whose types the stubs can spell (the data has no C spelling for structs, for example).
What the data lacks (the `NSObject` root, `BOOL`, `NSInteger`, the `NS_ENUM` and nullability
macros, fast enumeration, `MTLCreateSystemDefaultDevice`, libc++ shims) is written by hand below.

Usage: `python native/mpsgraph/stubgen.py [--metadata DIR] [--out DIR] [--check]`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "stubs"
# In CI the shared folder sits beside the checkout: <repo>/../shared.
DEFAULT_METADATA = HERE.parents[2] / "shared" / "mpsgraph-metadata"

# Lowest framework first: each header includes the one before it.
FRAMEWORKS = ("Foundation", "Metal", "MetalPerformanceShaders", "MetalPerformanceShadersGraph")
METADATA_PATHS = {
    "Foundation": "Foundation/arm64-26.5.fwinfo",
    "Metal": "Metal/arm64-26.5.fwinfo",
    "MetalPerformanceShaders": "MetalPerformanceShaders/arm64-26.5.fwinfo",
    "MetalPerformanceShadersGraph": "MetalPerformanceShadersGraph/arm64-26.5.fwinfo",
}

# What is emitted in full (None = every class / protocol of the framework). Superclasses and
# adopted protocols of these are added automatically.
SELECTED_CLASSES: dict[str, tuple[str, ...] | None] = {
    "Foundation": (
        "NSArray",
        "NSMutableArray",
        "NSDictionary",
        "NSMutableDictionary",
        "NSSet",
        "NSString",
        "NSNumber",
        "NSValue",
        "NSData",
        "NSMutableData",
        "NSURL",
        "NSError",
        "NSException",
        "NSEnumerator",
        "NSProcessInfo",
        "NSFileManager",
    ),
    "Metal": (),
    "MetalPerformanceShaders": (
        "MPSCommandBuffer",
        "MPSNDArray",
        "MPSNDArrayDescriptor",
        "MPSMatrix",
        "MPSVector",
        "MPSImage",
    ),
    "MetalPerformanceShadersGraph": None,
}
SELECTED_PROTOCOLS: dict[str, tuple[str, ...] | None] = {
    "Foundation": ("NSCopying", "NSMutableCopying", "NSCoding", "NSSecureCoding"),
    "Metal": (
        "MTLDevice",
        "MTLBuffer",
        "MTLResource",
        "MTLAllocation",
        "MTLCommandQueue",
        "MTLCommandBuffer",
        "MTLEvent",
        "MTLSharedEvent",
        "MTLTensor",
    ),
    "MetalPerformanceShaders": (),
    "MetalPerformanceShadersGraph": None,
}
# Declared by hand (HAND_WRITTEN_*), so never generated from the data.
SKIPPED_CLASSES = {"NSObject"}
SKIPPED_PROTOCOLS = {"NSObject", "NSFastEnumeration"}

ENUM_UNDERLYING = {
    "Q": "NSUInteger",
    "q": "NSInteger",
    "I": "uint32_t",
    "i": "int32_t",
    "S": "uint16_t",
    "s": "int16_t",
    "C": "uint8_t",
    "c": "int8_t",
    "L": "uint32_t",
    "l": "int32_t",
}

# Spellings every header may use: C and ObjC keywords, and what the hand-written base declares.
BUILTIN_WORDS = frozenset(
    """void char short int long unsigned signed float double bool const volatile
    _Nullable _Nonnull _Null_unspecified __kindof __unsafe_unretained __autoreleasing __strong
    __weak id SEL Class IMP instancetype Protocol BOOL NSInteger NSUInteger NSZone
    int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t
    NSRange NSOperatingSystemVersion NSFastEnumerationState dispatch_queue_t NSObject""".split()
)

IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
FUNCTION_TYPE = re.compile(r"^([\w\s*]+?)\s*\((.*)\)$")
# Deprecation versions of 100000 and up mean "to be deprecated": no version yet.
NO_VERSION_YET = 100000


def load_fwinfo(path: Path) -> dict:
    """The `definitions` of one `.fwinfo` file (JSON after leading `//` comment lines)."""
    lines = path.read_text().splitlines()
    body = "\n".join(line for line in lines if not line.startswith("//"))
    return json.loads(body)["definitions"]


def clean_type(type_name: str) -> str:
    """The metadata's C spelling, made valid C++ (`_Bool` is C only)."""
    return re.sub(r"\b_Bool\b", "bool", type_name).strip()


def enum_literal(value: int | str) -> str:
    """A constant's value (or the constant it aliases) as a C++ literal of the right width."""
    if isinstance(value, int) and value > 2**63 - 1:
        return f"{value}ULL"
    return str(value)


def availability(record: dict) -> str:
    parts = []
    if record.get("introduced"):
        parts.append(f"introduced={record['introduced']}")
    deprecated = record.get("deprecated")
    if deprecated and float(deprecated.split(".")[0]) < NO_VERSION_YET:
        parts.append(f"deprecated={deprecated}")
    if not parts:
        return ""
    return f" __attribute__((availability(macos,{','.join(parts)})))"


@dataclass
class Framework:
    name: str
    data: dict
    classes: list[str] = field(default_factory=list)
    protocols: list[str] = field(default_factory=list)
    typedefs: list[tuple[str, str]] = field(default_factory=list)


class Generator:
    """Turns the four metadata files into four headers, resolving types framework by framework."""

    def __init__(self, metadata_dir: Path) -> None:
        self.frameworks = [
            Framework(name, load_fwinfo(metadata_dir / METADATA_PATHS[name])) for name in FRAMEWORKS
        ]
        self.known: set[str] = set(BUILTIN_WORDS)
        self.skipped_methods = 0

    # -- type resolution -------------------------------------------------------------------

    def spellable(self, type_name: str, extra: frozenset[str] = frozenset()) -> bool:
        words = IDENTIFIER.findall(clean_type(type_name))
        return all(word in self.known or word in extra for word in words)

    def method_ok(self, method: dict, extra: frozenset[str]) -> bool:
        records = [method["retval"], *method["args"]]
        return all(self.spellable(record["type_name"], extra) for record in records)

    # -- emission --------------------------------------------------------------------------

    def method_decl(self, method: dict) -> str:
        sign = "+" if method["class_method"] else "-"
        retval = method["retval"]
        ret = "instancetype" if retval.get("instancetype") else clean_type(retval["type_name"])
        selector = method["selector"]
        if not method["args"]:
            head = f"{sign} ({ret}){selector}"
        else:
            keywords = selector.split(":")[:-1]
            pieces = [
                f"{keyword}:({clean_type(arg['type_name'])})arg{index}"
                for index, (keyword, arg) in enumerate(zip(keywords, method["args"], strict=True))
            ]
            head = f"{sign} ({ret})" + " ".join(pieces)
            if method.get("variadic"):
                head += ", ..."
        return head + availability(method) + ";"

    def method_block(self, methods: list[dict], extra: frozenset[str]) -> list[str]:
        seen: set[tuple[bool, str]] = set()
        lines = []
        for method in methods:
            key = (method["class_method"], method["selector"])
            if key in seen:
                continue
            seen.add(key)
            if not self.method_ok(method, extra):
                self.skipped_methods += 1
                continue
            lines.append(self.method_decl(method))
        return lines

    def property_block(self, record: dict, extra: frozenset[str]) -> list[str]:
        """Properties without accessor methods in the data (accessors are emitted as methods)."""
        method_names = {m["selector"] for m in record["methods"]}
        lines = []
        for prop in record.get("properties", []):
            attrs = []
            getter = prop["name"]
            for attribute in prop.get("attributes", []):
                if isinstance(attribute, list):  # ["getter", "isValid"]
                    attrs.append(f"{attribute[0]}={attribute[1]}")
                    getter = attribute[1] if attribute[0] == "getter" else getter
                else:
                    attrs.append(attribute)
            if getter in method_names or not self.spellable(prop["type_name"], extra):
                continue
            type_name = clean_type(prop["type_name"])
            lines.append(f"@property ({', '.join(attrs)}) {type_name} {prop['name']};")
        return lines

    def selection(self, framework: Framework) -> tuple[list[str], list[str]]:
        """Classes (superclass first) and protocols (adopted first) emitted in full."""
        classes_data = framework.data["classes"]
        protocols_data = framework.data["formal_protocols"]
        wanted_classes = SELECTED_CLASSES[framework.name]
        wanted_protocols = SELECTED_PROTOCOLS[framework.name]
        class_names = sorted(classes_data) if wanted_classes is None else list(wanted_classes)
        protocol_names = (
            sorted(protocols_data) if wanted_protocols is None else list(wanted_protocols)
        )
        ordered_classes: list[str] = []

        def add_class(name: str) -> None:
            if name in ordered_classes or name in SKIPPED_CLASSES or name not in classes_data:
                return
            add_class(classes_data[name].get("super") or "")
            for protocol in classes_data[name].get("protocols", []):
                add_protocol(protocol)
            ordered_classes.append(name)

        ordered_protocols: list[str] = []

        def add_protocol(name: str) -> None:
            if name in ordered_protocols or name in SKIPPED_PROTOCOLS:
                return
            if name not in protocols_data:
                return
            for adopted in protocols_data[name].get("implements", []):
                add_protocol(adopted)
            ordered_protocols.append(name)

        for name in protocol_names:
            add_protocol(name)
        for name in class_names:
            add_class(name)
        return ordered_classes, ordered_protocols

    def header(self, framework: Framework, below: str | None, defined_protocols: set[str]) -> str:
        data = framework.data
        out = [
            "// GENERATED by native/mpsgraph/stubgen.py from PyObjC's SDK metadata "
            f"({METADATA_PATHS[framework.name]}). DO NOT EDIT.",
            "// A stub for type-checking on Linux only; never used to build on macOS.",
            "#pragma once",
        ]
        out.append(f"#include <{below}/{below}.h>" if below else '#include "../_lucid_base.h"')
        # No NS_ASSUME_NONNULL: the data has no reliable nullability (see the README), and
        # assuming non-null would flag every `name:nil`.

        # Forward declarations make every class and protocol of the framework usable as a type.
        for name in sorted(data["classes"]):
            if name in SKIPPED_CLASSES:
                continue
            params = data["classes"][name].get("template_parameters")
            out.append(f"@class {name}<{', '.join(params)}>;" if params else f"@class {name};")
            self.known.add(name)
        for name in sorted(data["formal_protocols"]):
            if name in SKIPPED_PROTOCOLS:
                continue
            out.append(f"@protocol {name};")
            self.known.add(name)

        out.extend(self.enums(data))
        out.extend(self.typedefs(data))

        classes, protocols = self.selection(framework)
        for name in protocols:
            record = data["formal_protocols"][name]
            adopted = [p for p in record.get("implements", []) if p in defined_protocols]
            adopted_text = f" <{', '.join(adopted)}>" if adopted else ""
            out.append(f"\n@protocol {name}{adopted_text}")
            required = [m for m in record["methods"] if m.get("required", True)]
            optional = [m for m in record["methods"] if not m.get("required", True)]
            out.extend(self.property_block(record, frozenset()))
            out.extend(self.method_block(required, frozenset()))
            if optional:
                out.append("@optional")
                out.extend(self.method_block(optional, frozenset()))
            out.append("@end")
            defined_protocols.add(name)
        for name in classes:
            record = data["classes"][name]
            params = record.get("template_parameters") or []
            extra = frozenset(params)
            generic = f"<{', '.join(params)}>" if params else ""
            superclass = record.get("super") or "NSObject"
            adopted = [p for p in record.get("protocols", []) if p in defined_protocols]
            adopted_text = f" <{', '.join(adopted)}>" if adopted else ""
            out.append(f"\n@interface {name}{generic} : {superclass}{adopted_text}")
            out.extend(self.property_block(record, extra))
            out.extend(self.method_block(record["methods"], extra))
            out.append("@end")

        if framework.name == "Metal":
            out.append(HAND_WRITTEN_METAL_FUNCTIONS)
        out.append("")
        return "\n".join(out)

    def enums(self, data: dict) -> list[str]:
        by_type: dict[str, list[tuple[str, int]]] = {name: [] for name in data["enum_type"]}
        for constant, record in sorted(data["enum"].items()):
            owner = record.get("enum")
            if owner in by_type:
                by_type[owner].append((constant, record["value"]))
        defined = {constant for constants in by_type.values() for constant, _ in constants}
        for alias, target in sorted(data.get("aliases", {}).items()):
            if alias in defined:
                continue
            for constants in by_type.values():
                if any(name == target for name, _ in constants):
                    constants.append((alias, target))
                    break
        lines = []
        for name in sorted(by_type):
            underlying = ENUM_UNDERLYING.get(data["enum_type"][name]["type"], "NSInteger")
            constants = by_type[name]
            lines.append(f"typedef NS_ENUM({underlying}, {name}) {{")
            lines.extend(f"  {constant} = {enum_literal(value)}," for constant, value in constants)
            lines.append("};")
            self.known.add(name)
        return lines

    def typedefs(self, data: dict) -> list[str]:
        """Object and block typedefs whose spelling resolves, in dependency order."""
        pending = {
            name: clean_type(target)
            for name, target in data["typedefs"].items()
            if not target.startswith(("enum ", "struct ", "union ")) and name not in self.known
        }
        lines = []
        progress = True
        while pending and progress:
            progress = False
            for name in sorted(pending):
                target = pending[name]
                if not self.spellable(target):
                    continue
                if "(^)" in target or "(*)" in target:  # block or function pointer
                    marker = "(^)" if "(^)" in target else "(*)"
                    lines.append(f"typedef {target.replace(marker, f'({marker[1]}{name})', 1)};")
                elif FUNCTION_TYPE.match(target):
                    result, params = FUNCTION_TYPE.match(target).groups()
                    lines.append(f"typedef {result} {name}({params});")
                else:
                    lines.append(f"typedef {target} {name};")
                self.known.add(name)
                del pending[name]
                progress = True
        return lines

    def generate(self) -> dict[str, str]:
        files = dict(HAND_WRITTEN_FILES)
        defined_protocols = set(SKIPPED_PROTOCOLS)  # hand-written: NSObject, NSFastEnumeration
        below = None
        for framework in self.frameworks:
            path = f"{framework.name}/{framework.name}.h"
            files[path] = self.header(framework, below, defined_protocols)
            below = framework.name
        return files


# -- hand-written parts (what the metadata does not describe) ---------------------------------

HAND_WRITTEN_BASE = """\
// GENERATED by native/mpsgraph/stubgen.py (hand-written part). DO NOT EDIT.
// What the SDK metadata lacks: the ObjC root class and protocol, basic types and macros.
#pragma once
#include <objc/objc.h>
#include <stdint.h>
#include <stddef.h>
#include <TargetConditionals.h>

typedef long NSInteger;
typedef unsigned long NSUInteger;
typedef struct _NSZone NSZone;
typedef struct _NSRange { NSUInteger location; NSUInteger length; } NSRange;
typedef struct {
  NSInteger majorVersion;
  NSInteger minorVersion;
  NSInteger patchVersion;
} NSOperatingSystemVersion;
typedef struct {
  unsigned long state;
  id __unsafe_unretained _Nullable * _Nullable itemsPtr;
  unsigned long * _Nullable mutationsPtr;
  unsigned long extra[5];
} NSFastEnumerationState;

#define NS_ENUM(_type, _name) enum _name : _type _name; enum _name : _type
#define NS_OPTIONS(_type, _name) enum _name : _type _name; enum _name : _type
#define NS_ASSUME_NONNULL_BEGIN _Pragma("clang assume_nonnull begin")
#define NS_ASSUME_NONNULL_END _Pragma("clang assume_nonnull end")
#define NS_RETURNS_RETAINED __attribute__((ns_returns_retained))
#define NS_REQUIRES_NIL_TERMINATION __attribute__((sentinel(0, 1)))
#define API_AVAILABLE(...)
#define API_UNAVAILABLE(...)
#define NSIntegerMax __LONG_MAX__
#define NSNotFound NSIntegerMax

NS_ASSUME_NONNULL_BEGIN

@protocol NSObject
- (BOOL)isEqual:(nullable id)object;
@property (readonly) NSUInteger hash;
@property (readonly) Class superclass;
- (Class)class;
- (instancetype)self;
- (BOOL)isKindOfClass:(Class)aClass;
- (BOOL)isMemberOfClass:(Class)aClass;
- (BOOL)respondsToSelector:(SEL)aSelector;
- (BOOL)conformsToProtocol:(Protocol *)aProtocol;
@end

__attribute__((objc_root_class))
@interface NSObject <NSObject>
+ (instancetype)alloc;
+ (instancetype)new;
- (instancetype)init;
- (id)copy;
- (id)mutableCopy;
+ (Class)class;
+ (BOOL)instancesRespondToSelector:(SEL)aSelector;
@end

@protocol NSFastEnumeration
- (NSUInteger)countByEnumeratingWithState:(NSFastEnumerationState *)state
                                  objects:(id __unsafe_unretained _Nullable [_Nonnull])buffer
                                    count:(NSUInteger)len;
@end

@protocol OS_dispatch_queue <NSObject>
@end
typedef NSObject<OS_dispatch_queue> *dispatch_queue_t;

NS_ASSUME_NONNULL_END
"""

HAND_WRITTEN_OBJC = """\
// GENERATED by native/mpsgraph/stubgen.py (hand-written part). DO NOT EDIT.
// clang knows id, Class and SEL; the runtime header adds BOOL and nil.
#pragma once
typedef bool BOOL;
#define YES __objc_yes
#define NO __objc_no
#ifndef nil
#define nil nullptr
#endif
#ifndef Nil
#define Nil nullptr
#endif
"""

HAND_WRITTEN_TARGET_CONDITIONALS = """\
// GENERATED by native/mpsgraph/stubgen.py (hand-written part). DO NOT EDIT.
#pragma once
#define TARGET_OS_MAC 1
#define TARGET_OS_OSX 1
#define TARGET_OS_IPHONE 0
#define TARGET_OS_IOS 0
#define TARGET_CPU_ARM64 1
"""

# libc++ includes Apple's <xlocale.h> when __APPLE__ is defined; glibc has no such header.
HAND_WRITTEN_XLOCALE = """\
// GENERATED by native/mpsgraph/stubgen.py (hand-written part). DO NOT EDIT.
// libc++ includes <xlocale.h> under __APPLE__; on glibc its declarations live in <locale.h>.
#pragma once
#include <locale.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
// glibc's *_l ctype macros dereference the locale; libc++ passes 0 for the C locale on Apple.
#undef isalnum_l
#undef isalpha_l
#undef isblank_l
#undef iscntrl_l
#undef isdigit_l
#undef isgraph_l
#undef islower_l
#undef isprint_l
#undef ispunct_l
#undef isspace_l
#undef isupper_l
#undef isxdigit_l
#undef tolower_l
#undef toupper_l
// Apple's xlocale printf/scanf family, which glibc lacks.
int snprintf_l(char*, size_t, locale_t, const char*, ...);
int asprintf_l(char**, locale_t, const char*, ...);
int sscanf_l(const char*, locale_t, const char*, ...);
"""

HAND_WRITTEN_METAL_FUNCTIONS = """
// Functions: the metadata has encodings only, no C spellings.
extern _Nullable id<MTLDevice> MTLCreateSystemDefaultDevice(void) NS_RETURNS_RETAINED
    __attribute__((availability(macos,introduced=10.11)));"""

HAND_WRITTEN_FILES = {
    "_lucid_base.h": HAND_WRITTEN_BASE,
    "objc/objc.h": HAND_WRITTEN_OBJC,
    "TargetConditionals.h": HAND_WRITTEN_TARGET_CONDITIONALS,
    "_libc/xlocale.h": HAND_WRITTEN_XLOCALE,
}


def generate(metadata_dir: Path) -> dict[str, str]:
    """Relative path -> text of every stub header."""
    return Generator(metadata_dir).generate()


def write(files: dict[str, str], out_dir: Path) -> None:
    for relative, text in files.items():
        path = out_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def differences(files: dict[str, str], out_dir: Path) -> list[str]:
    """Stub files that are missing, stale or extra in `out_dir`."""
    problems = []
    for relative, text in sorted(files.items()):
        path = out_dir / relative
        if not path.exists():
            problems.append(f"missing: {relative}")
        elif path.read_text() != text:
            problems.append(f"stale: {relative}")
    present = {str(p.relative_to(out_dir)) for p in out_dir.rglob("*.h")}
    problems.extend(f"extra: {name}" for name in sorted(present - set(files)))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metadata", type=Path, default=DEFAULT_METADATA)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    if not args.metadata.is_dir():
        print(f"stubgen: metadata folder not found: {args.metadata}", file=sys.stderr)
        return 2
    files = generate(args.metadata)
    if args.check:
        problems = differences(files, args.out)
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    write(files, args.out)
    print(f"stubgen: wrote {len(files)} headers to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
