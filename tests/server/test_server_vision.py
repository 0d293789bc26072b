"""`llminfer serve --mmproj`: images in chat requests as data: URLs, through
the real openai client, against the library's own answer; bad images 400."""


import numpy as np
import pytest

pytest.importorskip("starlette", reason="the server needs starlette (pip install 'llminfer[serve]')")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'llminfer[serve]')")
openai = pytest.importorskip("openai", reason="the server tests use the openai client")
pytest.importorskip("PIL")

import llminfer  # noqa: E402
from llminfer.server import ServeArgs  # noqa: E402
from servers import ServerThread  # noqa: E402
from images import GEMMA_TEMPLATE, HOSTILE, IMAGE_TOKENS, data_url, png, synthetic  # noqa: E402
from tiny_models import TinyConfig, TinyMmproj, write_mmproj, write_model  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("server_vision")
    model = write_model(d / "gemma3.gguf", TinyConfig(arch="gemma3"),
                        extra_strings={"tokenizer.chat_template": GEMMA_TEMPLATE}, extra_tokens=IMAGE_TOKENS)
    return model, write_mmproj(d / "mmproj.gguf", TinyMmproj(qtype="F16"))


@pytest.fixture(scope="module")
def server(files):
    model, mm = files
    s = ServerThread(ServeArgs(model=model, mmproj=mm, n_ctx=256, kv_pool_tokens=2048, n_threads=1,
                               max_batch_tokens=16, max_body_bytes=1 << 20))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def messages(url):
    """Text around the image long enough that full KV blocks (32
    positions) hold the image: the prefix cache would match them."""
    return [{"role": "user", "content": [{"type": "text", "text": "look at this picture, one I took myself:"},
                                         {"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": " what is in it? tell me in a few words please."}]}]


def test_openai_client_sends_an_image(files, client):
    """The server's greedy reply and its token count are the library's, for
    two images (chunks of 16 tokens: the image's rows are a chunk apart),
    and a repeated request gives the same: another image at the same place
    is not taken from the prefix cache."""
    model, mm = files
    seconds = []  # the first token's runner-up logprob: the tiny model's answer is sure, its alternatives not
    with llminfer.LLM(model, mmproj=mm, n_ctx=256, n_threads=1) as llm:
        for seed in (1, 2):
            msgs = messages(data_url(png(synthetic(40, 70, seed=seed))))
            want = llm.chat_completion(msgs, max_tokens=8, temperature=0, logprobs=2)
            for _ in range(2):
                r = client.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0,
                                                   logprobs=True, top_logprobs=2)
                assert r.choices[0].message.content == want.text
                second = r.choices[0].logprobs.content[0].top_logprobs[1].logprob
                assert second == pytest.approx(want.logprobs[0][1][1][1], abs=0.02)
                seconds.append(second)
                assert r.usage.prompt_tokens == want.prompt_tokens
                # the text before the image may come from the prefix cache, never the image's positions
                span = llm.chat_prompt(msgs).images[0]
                assert r.usage.prompt_tokens_details.cached_tokens <= span.start
    assert abs(seconds[0] - seconds[2]) > 0.01  # the image is read: another one moves the logits


def test_streaming_with_an_image(client):
    msgs = messages(data_url(png(synthetic(20, 20, seed=3))))
    whole = client.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0)
    pieces = client.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    assert text == whole.choices[0].message.content


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_images_are_400(client, name):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=messages(data_url(HOSTILE[name]())), max_tokens=2)
    assert "image" in str(e.value).lower()


@pytest.mark.parametrize("url", ["https://example.com/cat.png", "file:///etc/passwd", "/etc/passwd",
                                 "data:image/png;base64,@@@", "data:image/png,raw"])
def test_urls_that_are_not_data_urls_are_400(client, url):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=messages(url), max_tokens=2)


def test_a_body_past_the_limit_is_refused(client):
    big = data_url(png((np.random.default_rng(0).random((700, 700, 3)) * 255).astype(np.uint8)))
    assert len(big) > 1 << 20
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="m", messages=messages(big), max_tokens=2)
    assert e.value.status_code == 413


def test_too_many_images(client):
    url = data_url(png(synthetic(8, 8)))
    content = [{"type": "image_url", "image_url": {"url": url}}] * 9
    with pytest.raises(openai.BadRequestError, match="at most"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=2)


def test_images_without_mmproj_are_400(files):
    model, _ = files
    s = ServerThread(ServeArgs(model=model, n_ctx=128, kv_pool_tokens=512, n_threads=1))
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match="mmproj"):
            c.chat.completions.create(model="m", messages=messages(data_url(png(synthetic(8, 8)))), max_tokens=2)
    finally:
        s.stop()


def test_models_config_gives_a_model_its_mmproj(files, tmp_path):
    import json
    import os

    model, mm = files
    cfg = tmp_path / "models.json"
    cfg.write_text(json.dumps({"seeing": {"path": model, "mmproj": os.path.relpath(mm, tmp_path), "n_ctx": 256},
                               "blind": {"path": model, "n_ctx": 256}}))
    s = ServerThread(ServeArgs(models_config=str(cfg), n_threads=1))
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        msgs = messages(data_url(png(synthetic(8, 8))))
        r = c.chat.completions.create(model="seeing", messages=msgs, max_tokens=2, temperature=0)
        assert r.usage.prompt_tokens > 40
        with pytest.raises(openai.BadRequestError, match="mmproj"):
            c.chat.completions.create(model="blind", messages=msgs, max_tokens=2)
    finally:
        s.stop()


# ---- Anthropic's Messages API: image blocks through the same chat path ----

@pytest.fixture(scope="module")
def claude(server):
    anthropic = pytest.importorskip("anthropic", reason="the Messages API tests use the anthropic client")
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


GREEDY = {"temperature": 0}  # the anthropic client takes it through extra_body


def image_block(data: bytes, media_type="image/png") -> dict:
    import base64

    return {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                        "data": base64.b64encode(data).decode()}}


def anthropic_messages(block):
    """messages() as Anthropic's content blocks: the same text around the image."""
    return [{"role": "user", "content": [{"type": "text", "text": "look at this picture, one I took myself:"}, block,
                                         {"type": "text", "text": " what is in it? tell me in a few words please."}]}]


def test_anthropic_image_block_answers_as_the_openai_route(client, claude):
    """The anthropic client's image block gives the OpenAI route's greedy
    answer and prompt length for the same image and text, whole and
    streamed, and count_tokens counts the image's positions."""
    for seed in (4, 5):
        data = png(synthetic(30, 50, seed=seed))
        want = client.chat.completions.create(model="m", messages=messages(data_url(data)), max_tokens=8,
                                              temperature=0)
        msgs = anthropic_messages(image_block(data))
        r = claude.messages.create(model="m", max_tokens=8, messages=msgs, extra_body=GREEDY)
        assert "".join(b.text for b in r.content if b.type == "text") == want.choices[0].message.content
        assert r.usage.input_tokens == want.usage.prompt_tokens
        with claude.messages.stream(model="m", max_tokens=8, messages=msgs, extra_body=GREEDY) as s:
            assert "".join(s.text_stream) == want.choices[0].message.content
        assert claude.messages.count_tokens(model="m", messages=msgs).input_tokens == want.usage.prompt_tokens
    text_only = claude.messages.count_tokens(model="m", messages=[
        {"role": "user", "content": [b for b in msgs[0]["content"] if b["type"] == "text"]}]).input_tokens
    assert want.usage.prompt_tokens > text_only  # the image's rows are in the prompt


def _anthropic_400(claude, msgs):
    import anthropic

    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="m", max_tokens=2, messages=msgs)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    return e.value.body["error"]["message"]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_anthropic_hostile_images_are_400(claude, name):
    assert "image" in _anthropic_400(claude, anthropic_messages(image_block(HOSTILE[name]()))).lower()


@pytest.mark.parametrize("source", [
    {"type": "url", "url": "https://example.com/cat.png"},
    {"type": "url", "url": "file:///etc/passwd"},
    {"type": "base64", "media_type": "image/svg+xml", "data": "PHN2Zy8+"},
    {"type": "base64", "media_type": "image/png", "data": "@@@"},
    {"type": "file", "file_id": "file_123"},
    "not a source"])
def test_anthropic_image_sources_that_are_refused(claude, source):
    _anthropic_400(claude, anthropic_messages({"type": "image", "source": source}))


def test_anthropic_image_in_an_assistant_turn_is_400(claude):
    block = image_block(png(synthetic(8, 8)))
    _anthropic_400(claude, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [block]},
                            {"role": "user", "content": "and?"}])


# ---- Ollama's API: a message's images through the same chat path ----

@pytest.fixture(scope="module")
def llama(server):
    ollama = pytest.importorskip("ollama", reason="the Ollama API tests use the ollama client")
    return ollama.Client(host=server.url, timeout=120)


def test_ollama_images_answer_as_the_openai_route(client, llama):
    """The ollama client's images (bytes, sent as base64) give the OpenAI
    route's greedy answer and prompt length for the same image and text,
    placed before the text as Ollama places them; whole and streamed chat,
    and generate through the chat template."""
    question = "what is in this picture? tell me in a few words please."
    for seed in (6, 7):
        data = png(synthetic(40, 30, seed=seed))
        want = client.chat.completions.create(model="m", max_tokens=8, temperature=0, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(data)}},
                                         {"type": "text", "text": question}]}])
        opts = {"temperature": 0, "num_predict": 8}
        msgs = [{"role": "user", "content": question, "images": [data]}]
        r = llama.chat(model="m", messages=msgs, options=opts)
        assert r.message.content == want.choices[0].message.content
        assert r.prompt_eval_count == want.usage.prompt_tokens
        parts = list(llama.chat(model="m", messages=msgs, options=opts, stream=True))
        assert "".join(p.message.content for p in parts) == want.choices[0].message.content
        g = llama.generate(model="m", prompt=question, images=[data], options=opts)
        assert g.response == want.choices[0].message.content and g.prompt_eval_count == want.usage.prompt_tokens
    assert "vision" in llama.show("m").capabilities


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_ollama_hostile_images_are_400(server, llama, name):
    import base64

    import httpx
    import ollama

    data = HOSTILE[name]()
    body = {"model": "m", "stream": False,
            "messages": [{"role": "user", "content": "hi", "images": [base64.b64encode(data).decode()]}]}
    r = httpx.post(server.url + "/api/chat", json=body, timeout=60)
    assert r.status_code == 400 and set(r.json()) == {"error"} and "image" in r.json()["error"].lower(), r.text
    if data:  # the client refuses to send an empty image itself
        with pytest.raises(ollama.ResponseError) as e:
            llama.generate(model="m", prompt="hi", images=[data])
        assert e.value.status_code == 400 and "image" in e.value.error.lower()


def test_ollama_image_that_is_not_base64_is_400(server):
    import httpx

    r = httpx.post(server.url + "/api/chat", timeout=60, json={
        "model": "m", "stream": False, "messages": [{"role": "user", "content": "hi", "images": ["@@not base64@@"]}]})
    assert r.status_code == 400 and "base64" in r.json()["error"]


# ---- an idefics3 (SmolVLM) projector: tiles, causal rows ----

def test_idefics3_images_through_the_server(tmp_path):
    """A SmolVLM-style tower (2 x 2 tiles and the overview: 20 rows, more
    than a step's 16 tokens, so the rows run over several steps, causally)
    answers as the library does, through the OpenAI and Ollama routes."""
    import base64

    from images import IDEFICS3_TOKENS

    ollama = pytest.importorskip("ollama", reason="the Ollama API tests use the ollama client")
    model = write_model(tmp_path / "smolvlm.gguf", TinyConfig(), extra_tokens=IDEFICS3_TOKENS)
    mm = write_mmproj(tmp_path / "mmproj.gguf", TinyMmproj(projector="idefics3", qtype="F16"))
    data = png(synthetic(45, 60, seed=9))
    msgs = messages(data_url(data))
    with llminfer.LLM(model, mmproj=mm, n_ctx=256, n_threads=1) as llm:
        want = llm.chat_completion(msgs, max_tokens=6, temperature=0)
        assert sum(len(s.rows) for s in llm.chat_prompt(msgs).images) == 20
    s = ServerThread(ServeArgs(model=model, mmproj=mm, n_ctx=256, kv_pool_tokens=1024, n_threads=1,
                               max_batch_tokens=16))
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        r = c.chat.completions.create(model="m", messages=msgs, max_tokens=6, temperature=0)
        assert r.choices[0].message.content == want.text and r.usage.prompt_tokens == want.prompt_tokens
        first, second = (p["text"] for p in (msgs[0]["content"][0], msgs[0]["content"][2]))
        o = ollama.Client(host=s.url, timeout=120).chat(model="m", options={"temperature": 0, "num_predict": 6},
                                                        messages=[{"role": "user", "content": first + second,
                                                                   "images": [base64.b64encode(data).decode()]}])
        image_first = c.chat.completions.create(model="m", max_tokens=6, temperature=0, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(data)}},
                                         {"type": "text", "text": first + second}]}])
        assert o.message.content == image_first.choices[0].message.content
    finally:
        s.stop()


def test_gemma4_images_through_the_server(tmp_path):
    """A Gemma 4 tower (84 rows a picture, run in one step, both ways in the
    sliding-window layers): three requests at once, two pictures and one
    text, each answer the library's alone (the server's batches keep a
    sequence's logits as they are alone)."""
    from concurrent.futures import ThreadPoolExecutor

    from images import gemma4_text_model
    from tiny_models import TinyGemma4v, write_gemma4v_mmproj

    model = gemma4_text_model(tmp_path / "gemma4.gguf")
    mm = write_gemma4v_mmproj(tmp_path / "mmproj.gguf", TinyGemma4v(qtype="F16"))
    reqs = [messages(data_url(png(synthetic(40, 70, seed=s)))) for s in (11, 12)]
    reqs.append([{"role": "user", "content": "say something about pictures, please, in a few words"}])
    with llminfer.LLM(model, mmproj=mm, n_ctx=512, n_threads=1) as llm:
        want = [llm.chat_completion(m, max_tokens=6, temperature=0, logprobs=1) for m in reqs]
        assert len(llm.chat_prompt(reqs[0]).images[0].rows) == 84
    s = ServerThread(ServeArgs(model=model, mmproj=mm, n_ctx=512, kv_pool_tokens=2048, n_threads=1,
                               max_batch_tokens=128))
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(m):
            return c.chat.completions.create(model="m", messages=m, max_tokens=6, temperature=0, logprobs=True)

        with ThreadPoolExecutor(3) as pool:
            got = list(pool.map(ask, reqs))
        for r, w in zip(got, want):
            assert r.choices[0].message.content == w.text and r.usage.prompt_tokens == w.prompt_tokens
            lp = [t.logprob for t in r.choices[0].logprobs.content]
            np.testing.assert_allclose(lp, [x[0] for x in w.logprobs], rtol=0, atol=1e-4)
    finally:
        s.stop()


def test_lfm2_images_through_the_server(tmp_path):
    """An LFM2-VL tower into a hybrid lfm2 (77 rows a picture, more than a
    step's 32 tokens: the rows run over several steps, causally, the
    recurrent state carried between them): three requests at once, two
    pictures and one text, each answer the library's alone."""
    from concurrent.futures import ThreadPoolExecutor

    from images import lfm2_text_model
    from tiny_models import LFM2_MMPROJ

    model = lfm2_text_model(tmp_path / "lfm2.gguf", tie_output=False)
    mm = write_mmproj(tmp_path / "mmproj.gguf", TinyMmproj(**LFM2_MMPROJ, qtype="F16"))
    reqs = [messages(data_url(png(synthetic(40, 70, seed=s)))) for s in (13, 14)]
    reqs.append([{"role": "user", "content": "say something about pictures, please, in a few words"}])
    with llminfer.LLM(model, mmproj=mm, n_ctx=512, n_threads=1) as llm:
        want = [llm.chat_completion(m, max_tokens=6, temperature=0, logprobs=1) for m in reqs]
        assert len(llm.chat_prompt(reqs[0]).images[0].rows) == 77
    s = ServerThread(ServeArgs(model=model, mmproj=mm, n_ctx=512, kv_pool_tokens=2048, n_threads=1,
                               max_batch_tokens=32))
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(m):
            return c.chat.completions.create(model="m", messages=m, max_tokens=6, temperature=0, logprobs=True)

        with ThreadPoolExecutor(3) as pool:
            got = list(pool.map(ask, reqs))
        for r, w in zip(got, want):
            assert r.choices[0].message.content == w.text and r.usage.prompt_tokens == w.prompt_tokens
            lp = [t.logprob for t in r.choices[0].logprobs.content]
            np.testing.assert_allclose(lp, [x[0] for x in w.logprobs], rtol=0, atol=1e-4)
    finally:
        s.stop()


@pytest.mark.parametrize("tower", ["qwen2.5vl", "qwen3vl"])
def test_qwen_vl_images_through_the_server(tmp_path, tower):
    """A Qwen2.5-VL tower (77 rows a picture) or a Qwen3-VL one (54 rows 3 x
    256 wide: DeepStack), decoded causally in chunks of the step's token
    budget, their M-RoPE positions from the chunk's place in the image:
    three requests at once, two pictures and one text, each answer the
    library's alone."""
    from concurrent.futures import ThreadPoolExecutor

    from images import QWEN_IMAGE_TOKENS, QWEN_TEMPLATE, qwen2vl_text_model
    from tiny_models import (TinyConfig, TinyQwen25vl, TinyQwen3vl, write_model, write_qwen25vl_mmproj,
                             write_qwen3vl_mmproj)

    if tower == "qwen3vl":
        model = write_model(tmp_path / "qwen3vl.gguf", TinyConfig(arch="qwen3vl", pre="default", n_layer=4),
                            extra_strings={"tokenizer.chat_template": QWEN_TEMPLATE}, extra_tokens=QWEN_IMAGE_TOKENS)
        mm, grid = write_qwen3vl_mmproj(tmp_path / "mmproj.gguf", TinyQwen3vl(qtype="F16")), (9, 6)
    else:
        model = qwen2vl_text_model(tmp_path / "qwen2vl.gguf")
        mm, grid = write_qwen25vl_mmproj(tmp_path / "mmproj.gguf", TinyQwen25vl(qtype="F16")), (11, 7)
    reqs = [messages(data_url(png(synthetic(200, 300, seed=s)))) for s in (11, 12)]
    reqs.append([{"role": "user", "content": "say something about pictures, please, in a few words"}])
    with llminfer.LLM(model, mmproj=mm, n_ctx=512, n_threads=1) as llm:
        want = [llm.chat_completion(m, max_tokens=6, temperature=0, logprobs=1) for m in reqs]
        assert llm.chat_prompt(reqs[0]).images[0].grid == grid
    s = ServerThread(ServeArgs(model=model, mmproj=mm, n_ctx=512, kv_pool_tokens=2048, n_threads=1,
                               max_batch_tokens=32))
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(m):
            return c.chat.completions.create(model="m", messages=m, max_tokens=6, temperature=0, logprobs=True)

        with ThreadPoolExecutor(3) as pool:
            got = list(pool.map(ask, reqs))
        for r, w in zip(got, want):
            assert r.choices[0].message.content == w.text and r.usage.prompt_tokens == w.prompt_tokens
            lp = [t.logprob for t in r.choices[0].logprobs.content]
            np.testing.assert_allclose(lp, [x[0] for x in w.logprobs], rtol=0, atol=1e-4)
    finally:
        s.stop()
