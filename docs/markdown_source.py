"""A Sphinx source parser for the guides' Markdown, on markdown-it-py (the parser
MyST builds on), so ``sphinx-build -W`` checks them as it checks reStructuredText.

The guides are GitHub-flavoured CommonMark and stay readable on GitHub; this maps
their few constructs onto docutils nodes. Strictness comes from Sphinx: a link to a
``.md`` page becomes a ``doc`` cross-reference and one with ``#anchor`` a ``ref`` to
that page's heading (GitHub's anchor rule), so a broken link or anchor is a warning,
and ``-W`` makes every warning fail the build. Anything this parser does not know
is a warning too, never silently dropped, and so is a link to a file that is not a
page (name files in code spans: the site carries no source tree).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from docutils import nodes
from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.parsers import Parser
from sphinx.util import logging

logger = logging.getLogger(__name__)
MD = MarkdownIt("commonmark").enable("table")


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


class MarkdownParser(Parser):
    supported = ("markdown", "md")

    def parse(self, inputstring: str, document: nodes.document) -> None:
        self.document = document
        self.docname: str = document.settings.env.docname
        self.sections: list[tuple[int, nodes.Element]] = [(0, document)]
        for node in SyntaxTreeNode(MD.parse(inputstring)).children:
            self.sections[-1][1].extend(self.block(node))
        if not self.docname.startswith(("docs/", "README")):
            # A README beside the code: reached by the guides' links, not the navigation.
            document.settings.env.metadata[self.docname]["orphan"] = True
        first = document.next_node(nodes.section)
        if self.docname == document.settings.env.config.root_doc and first is not None:
            first += self.toctree(inputstring)

    # -- blocks -------------------------------------------------------------

    def block(self, node: SyntaxTreeNode) -> list[nodes.Node]:
        self.lineno = node.map[0] + 1 if node.map else 0  # where an inline warning points
        t = node.type
        if t == "heading":
            self.heading(node)
            return []
        if t == "paragraph":
            return [self.line(node, nodes.paragraph("", "", *self.inlines(node)))]
        if t in ("bullet_list", "ordered_list"):
            lst = nodes.bullet_list() if t == "bullet_list" else nodes.enumerated_list()
            for item in node.children:
                li = nodes.list_item()
                for child in item.children:
                    li += self.block(child)
                lst += li
            return [lst]
        if t in ("fence", "code_block"):
            block = nodes.literal_block(node.content, node.content)
            block["language"] = (node.info or "text").split()[0]
            return [self.line(node, block)]
        if t == "blockquote":
            quote = nodes.block_quote()
            for child in node.children:
                quote += self.block(child)
            return [quote]
        if t == "hr":
            return [nodes.transition()]
        if t == "html_block" and node.content.lstrip().startswith("<!--"):
            return [nodes.comment(node.content, node.content)]
        if t == "table":
            return [self.table(node)]
        return self.unknown(node)

    def heading(self, node: SyntaxTreeNode) -> None:
        level = int(node.tag[1:])
        while self.sections[-1][0] >= level:
            self.sections.pop()
        title = "".join(n.content for n in node.walk() if n.type in ("text", "code_inline"))
        anchor = github_anchor(title)
        section = nodes.section(ids=[anchor], names=[f"{self.docname}#{anchor}"])
        section += nodes.title("", "", *self.inlines(node.children[0]))
        self.document.note_explicit_target(section, section)  # the label links resolve to
        self.sections[-1][1].append(section)
        self.sections.append((level, section))

    def table(self, node: SyntaxTreeNode) -> nodes.table:
        rows = [r for part in node.children for r in part.children]
        group = nodes.tgroup(cols=len(rows[0].children))
        group += [nodes.colspec(colwidth=1) for _ in rows[0].children]
        for part in node.children:
            body = nodes.thead() if part.type == "thead" else nodes.tbody()
            for row in part.children:
                tr = nodes.row()
                for cell in row.children:
                    inline = cell.children[0] if cell.children else None
                    content = self.inlines(inline) if inline else []
                    tr += nodes.entry("", nodes.paragraph("", "", *content))
                body += tr
            group += body
        return nodes.table("", group)

    def toctree(self, text: str) -> list[nodes.Node]:
        """The site's navigation: the root page's index of guides (its paragraph with the
        most page links), in that order, then any other page it links to."""
        link = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")
        index = max(text.split("\n\n"), key=lambda para: len(link.findall(para)))
        pages = [self.resolve(target) for target in link.findall(index + text)]
        entries = list(dict.fromkeys(p for p in pages if p != self.docname))
        tree = addnodes.toctree(
            parent=self.docname, entries=[(None, e) for e in entries], includefiles=entries,
            maxdepth=1, hidden=True, glob=False, titlesonly=True, caption=None,
            numbered=0, includehidden=False,
        )  # fmt: skip
        return [addnodes.compact_paragraph("", "", tree, toctree=True)]

    # -- inlines ------------------------------------------------------------

    def inlines(self, node: SyntaxTreeNode) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for child in node.children:
            t = child.type
            if t == "inline":
                out += self.inlines(child)
            elif t == "text":
                out.append(nodes.Text(child.content))
            elif t in ("softbreak", "hardbreak"):
                out.append(nodes.Text(" " if t == "softbreak" else "\n"))
            elif t == "code_inline":
                out.append(nodes.literal(child.content, child.content))
            elif t in ("strong", "em"):
                kind = nodes.strong if t == "strong" else nodes.emphasis
                out.append(kind("", "", *self.inlines(child)))
            elif t == "link":
                out.append(self.link(child))
            elif t == "html_inline" and child.content.startswith("<!--"):
                continue
            else:
                out += self.unknown(child)
        return out

    def link(self, node: SyntaxTreeNode) -> nodes.Node:
        target = str(node.attrs["href"])
        label = self.inlines(node)
        if re.match(r"[a-z]+:", target):
            return nodes.reference("", "", *label, refuri=target)
        path, _, anchor = target.partition("#")
        if path and not path.endswith(".md"):
            where = (self.docname, self.lineno)
            logger.warning("link to a non-page %r", target, location=where)
            return nodes.inline("", "", *label)
        doc = self.resolve(path) if path else self.docname
        kind, ref = ("ref", f"{doc}#{anchor}") if anchor else ("doc", "/" + doc)
        xref = addnodes.pending_xref(
            "", refdomain="std", reftype=kind, reftarget=ref, refexplicit=True,
            refdoc=self.docname, refwarn=True,
        )  # fmt: skip
        xref += nodes.inline("", "", *label)
        return xref

    def resolve(self, path: str) -> str:
        """A link's docname, relative to this page, as Sphinx names pages."""
        joined = posixpath.normpath(posixpath.join(posixpath.dirname(self.docname), path))
        return joined.removesuffix(".md")

    # -- helpers ------------------------------------------------------------

    def line(self, node: SyntaxTreeNode, element: nodes.Element) -> nodes.Element:
        if node.map:
            element.line = node.map[0] + 1
            element.source = self.document["source"]
        return element

    def unknown(self, node: SyntaxTreeNode) -> list[nodes.Node]:
        where = (self.docname, self.lineno)
        logger.warning("unsupported Markdown: %s", node.type, location=where)
        return []


def _front_door(app: Sphinx, exc: Exception | None) -> None:
    """index.html, where a web server looks, leads to the root page (README.html)."""
    root = app.config.root_doc
    if exc is None and app.builder.format == "html" and root != "index":
        page = f'<meta http-equiv="refresh" content="0; url={root}.html">\n'
        (app.outdir / "index.html").write_text(page)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_source_suffix(".md", "markdown")
    app.add_source_parser(MarkdownParser)
    app.connect("build-finished", _front_door)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
