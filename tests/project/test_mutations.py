"""make test-mutations (tests/helpers/mutations.py) stays able to run: each mutation's text is still in its file once, and each
test it names still exists. A refactor that moved the text would otherwise turn the mutation into an error found only
when someone runs that long target."""

import ast

import pytest
from helpers.mutations import MUTATIONS, REPO


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda mutation: mutation.name)
def test_each_mutation_finds_its_text_once(mutation):
    text = (REPO / mutation.path).read_text()
    assert [text.count(old) for old, _ in mutation.replacements] == [1] * len(mutation.replacements)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda mutation: mutation.name)
def test_each_mutation_names_tests_that_exist(mutation):
    for node_id in mutation.tests:
        path, name = node_id.split("::")[0], node_id.split("::")[-1].split("[")[0]
        defined = {node.name for node in ast.walk(ast.parse((REPO / path).read_text())) if isinstance(node, ast.FunctionDef)}
        assert name in defined, f"{mutation.name}: {node_id}"
