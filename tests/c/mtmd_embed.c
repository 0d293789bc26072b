/* llama.cpp's libmtmd on one image, for tests/test_vision_peer.py: loads a
 * text model and its mmproj, tokenizes "<__media__>" with one RGB image
 * (raw bytes, nx * ny * 3), and writes what mtmd makes of it:
 *   OUT.tokens  text: the chunks, one line each ("text ID ID ..." or "image N")
 *   OUT.embd    float32 [N, n_embd]: the image chunk's embeddings
 * usage: mtmd_embed MODEL MMPROJ RGB NX NY PROMPT OUT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "mtmd.h"

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s MODEL MMPROJ RGB NX NY PROMPT OUT\n", argv[0]);
        return 2;
    }
    const int nx = atoi(argv[4]), ny = atoi(argv[5]);
    unsigned char *rgb = malloc((size_t)nx * ny * 3);
    FILE *f = fopen(argv[3], "rb");
    if (!f || fread(rgb, 1, (size_t)nx * ny * 3, f) != (size_t)nx * ny * 3) return 3;
    fclose(f);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 4;
    struct mtmd_context_params cp = mtmd_context_params_default();
    cp.use_gpu = false;
    cp.n_threads = 1;
    cp.print_timings = false;
    cp.warmup = false;
    mtmd_context *ctx = mtmd_init_from_file(argv[2], model, cp);
    if (!ctx) return 5;
    mtmd_bitmap *bmp = mtmd_bitmap_init(nx, ny, rgb);
    const mtmd_bitmap *bmps[1] = {bmp};
    mtmd_input_text text = {argv[6], strlen(argv[6]), true, true};
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    if (mtmd_tokenize(ctx, chunks, &text, bmps, 1) != 0) return 6;
    char path[4096];
    snprintf(path, sizeof path, "%s.tokens", argv[7]);
    FILE *tok = fopen(path, "w");
    snprintf(path, sizeof path, "%s.embd", argv[7]);
    FILE *emb = fopen(path, "wb");
    const int n_embd = llama_model_n_embd(model);
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk *c = mtmd_input_chunks_get(chunks, i);
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n;
            const llama_token *ids = mtmd_input_chunk_get_tokens_text(c, &n);
            fprintf(tok, "text");
            for (size_t j = 0; j < n; j++) fprintf(tok, " %d", ids[j]);
            fprintf(tok, "\n");
        } else {
            const size_t n = mtmd_input_chunk_get_n_tokens(c);
            if (mtmd_encode_chunk(ctx, c) != 0) return 7;
            fwrite(mtmd_get_output_embd(ctx), sizeof(float), n * (size_t)n_embd, emb);
            fprintf(tok, "image %zu %d\n", n, mtmd_decode_use_non_causal(ctx, c) ? 1 : 0);
        }
    }
    fclose(tok);
    fclose(emb);
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bmp);
    mtmd_free(ctx);
    llama_model_free(model);
    free(rgb);
    return 0;
}
