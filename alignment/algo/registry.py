"""Name -> function tables filled by a decorator, verl's core_algos style: each algorithm key of the config (advantage_estimator,
surrogate, loss_type, kl_estimator, ...) has one, and its choices are the table's names, in registration order."""

from collections.abc import Callable


class Registry:
    """`@TABLE.register("name")` above a function adds it; TABLE.get("name") returns it."""

    def __init__(self, unknown: str):
        # unknown: the error for a name not registered, formatted with name, choices ("a, b or c") and listed ("a, b, c")
        self.unknown = unknown
        self._entries: dict[str, Callable] = {}

    def register(self, name: str) -> Callable:
        def add(function: Callable) -> Callable:
            if name in self._entries:
                raise ValueError(f"{name!r} is registered twice (as {self._entries[name].__name__} and {function.__name__})")
            self._entries[name] = function
            return function

        return add

    def get(self, name: str) -> Callable:
        if name not in self._entries:
            names = self.names()
            choices = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
            raise ValueError(self.unknown.format(name=name, choices=choices, listed=", ".join(names)))
        return self._entries[name]

    def names(self) -> list:
        return list(self._entries)
