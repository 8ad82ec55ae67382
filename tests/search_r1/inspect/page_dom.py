"""A small element tree of an HTML page, built with the standard library's parser, for the viewer's tests to read
the page as a browser's DOM would hold it (tags, attributes, text), without running its script."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"meta", "input", "br", "img", "link", "hr", "source", "wbr", "area", "base", "col", "embed", "track"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str | None]
    children: list[Element | str] = field(default_factory=list)

    def iter(self) -> Iterator[Element]:
        yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.iter()

    def find_all(self, match: Callable[[Element], bool]) -> list[Element]:
        return [e for e in self.iter() if match(e)]

    def by_class(self, *names: str) -> list[Element]:
        return self.find_all(lambda e: set(names) <= set((e.attrs.get("class") or "").split()))

    def by_id(self, id_: str) -> Element:
        (found,) = self.find_all(lambda e: e.attrs.get("id") == id_)
        return found

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        element = Element(tag, dict(attrs))
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        while len(self.stack) > 1:
            if self.stack.pop().tag == tag:
                break

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(html: str) -> Element:
    builder = _Builder()
    builder.feed(html)
    builder.close()
    return builder.root
