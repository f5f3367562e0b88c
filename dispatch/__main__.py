"""python -m dispatch: the public ops, discovered from the registry, with their signatures,
first docstring line, family and registered implementations per device."""
import inspect

import dispatch
from dispatch import registry


def main():
    for family in registry.families():
        print(f"[{family}]")
        for op in registry.OPS.values():
            if op.family != family:
                continue
            sig = inspect.signature(op.public)
            doc = " ".join((inspect.getdoc(op.public) or "").split("\n\n")[0].split())
            print(f"  dispatch.{op.name}{sig}")
            print(f"      {doc}")
            for device in registry.DEVICES:
                names = [i.name for i in op.implementations.values() if i.device == device]
                if names:
                    print(f"      {device}: {', '.join(names)}")
    print("also: dispatch.explain(op, *args, **kwargs), dispatch.use(...)")
    for name, obj in dispatch._EXTRA.items():  # helpers the op modules export (__public__)
        sig = inspect.signature(obj) if inspect.isfunction(obj) else ""
        doc = " ".join((inspect.getdoc(obj) or "").split("\n\n")[0].split())
        print(f"  dispatch.{name}{sig}")
        print(f"      {doc}")


if __name__ == "__main__":
    main()
