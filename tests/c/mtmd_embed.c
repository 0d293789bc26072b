/* llama.cpp's libmtmd on one image, for tests/test_vision_peer.py: loads a
 * text model and its mmproj, tokenizes "<__media__>" with one RGB image
 * (raw bytes, nx * ny * 3), and writes what mtmd makes of it:
 *   OUT.tokens  text: the chunks, one line each ("text ID ID ..." or "image N")
 *   OUT.embd    float32 [N, n_embd_inp]: the image chunk's embeddings
 *   OUT.logits  float32 [n_vocab]: with MODE "causal" or "noncausal", the
 *               logits after the whole prompt, decoded by llama.cpp with the
 *               image's rows as input embeddings, attention over them causal
 *               or not (mtmd's helper makes it non-causal for Gemma 3); with
 *               MODE "helper", every chunk decoded by mtmd_helper_eval_chunks
 *               (its positions: Qwen-VL's M-RoPE ones for an image)
 *   OUT.gen     text: with N_GEN, the N_GEN tokens llama.cpp then draws
 *               greedily, one line each: "TOKEN MARGIN" (the largest logit
 *               less the second largest, before the token is drawn)
 * usage: mtmd_embed MODEL MMPROJ RGB NX NY PROMPT OUT [MODE [N_GEN]] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"

int main(int argc, char **argv) {
    if (argc < 8 || argc > 10) {
        fprintf(stderr, "usage: %s MODEL MMPROJ RGB NX NY PROMPT OUT [causal|noncausal [N_GEN]]\n", argv[0]);
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
    const int n_embd = llama_model_n_embd_inp(model); /* an input row: wider with DeepStack (Qwen3-VL) */
    struct llama_context *lctx = NULL;
    if (argc >= 9) {
        struct llama_context_params lp = llama_context_default_params();
        lp.n_ctx = 512;
        lp.n_batch = lp.n_ubatch = 512; /* a non-causal image must be one ubatch */
        lp.n_threads = lp.n_threads_batch = 1;
        lctx = llama_init_from_model(model, lp);
        if (!lctx) return 8;
    }
    int n_past = 0;
    const int helper = argc >= 9 && strcmp(argv[8], "helper") == 0;
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk *c = mtmd_input_chunks_get(chunks, i);
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n;
            const llama_token *ids = mtmd_input_chunk_get_tokens_text(c, &n);
            fprintf(tok, "text");
            for (size_t j = 0; j < n; j++) fprintf(tok, " %d", ids[j]);
            fprintf(tok, "\n");
            if (lctx && n && !helper) {
                llama_batch b = llama_batch_init((int32_t)n, 0, 1);
                for (size_t j = 0; j < n; j++) {
                    b.token[j] = ids[j];
                    b.pos[j] = n_past + (int)j;
                    b.n_seq_id[j] = 1;
                    b.seq_id[j][0] = 0;
                    b.logits[j] = j == n - 1;
                }
                b.n_tokens = (int32_t)n;
                if (llama_decode(lctx, b) != 0) return 9;
                llama_batch_free(b);
                n_past += (int)n;
            }
        } else {
            const size_t n = mtmd_input_chunk_get_n_tokens(c);
            if (mtmd_encode_chunk(ctx, c) != 0) return 7;
            const float *rows = mtmd_get_output_embd(ctx);
            fwrite(rows, sizeof(float), n * (size_t)n_embd, emb);
            fprintf(tok, "image %zu %d\n", n, mtmd_decode_use_non_causal(ctx, c) ? 1 : 0);
            if (lctx && !helper) {
                llama_batch b = llama_batch_init((int32_t)n, n_embd, 1);
                memcpy(b.embd, rows, n * (size_t)n_embd * sizeof(float));
                for (size_t j = 0; j < n; j++) {
                    b.pos[j] = n_past + (int)j;
                    b.n_seq_id[j] = 1;
                    b.seq_id[j][0] = 0;
                    b.logits[j] = j == n - 1;
                }
                b.n_tokens = (int32_t)n;
                const int noncausal = strcmp(argv[8], "noncausal") == 0;
                if (noncausal) llama_set_causal_attn(lctx, false);
                if (llama_decode(lctx, b) != 0) return 10;
                if (noncausal) llama_set_causal_attn(lctx, true);
                llama_batch_free(b);
                n_past += (int)n;
            }
        }
    }
    fclose(tok);
    fclose(emb);
    if (lctx && helper) {
        llama_pos new_past = 0;
        if (mtmd_helper_eval_chunks(ctx, lctx, chunks, 0, 0, 512, true, &new_past) != 0) return 12;
        n_past = (int)new_past;
    }
    if (lctx) {
        const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
        snprintf(path, sizeof path, "%s.logits", argv[7]);
        FILE *lg = fopen(path, "wb");
        fwrite(llama_get_logits_ith(lctx, -1), sizeof(float), (size_t)n_vocab, lg);
        fclose(lg);
        const int n_gen = argc == 10 ? atoi(argv[9]) : 0;
        snprintf(path, sizeof path, "%s.gen", argv[7]);
        FILE *gen = n_gen > 0 ? fopen(path, "w") : NULL;
        for (int k = 0; k < n_gen && gen; k++) {
            const float *z = llama_get_logits_ith(lctx, -1);
            int best = 0;
            for (int v = 1; v < n_vocab; v++)
                if (z[v] > z[best]) best = v;
            float second = -INFINITY;
            for (int v = 0; v < n_vocab; v++)
                if (v != best && z[v] > second) second = z[v];
            fprintf(gen, "%d %.6f\n", best, z[best] - second);
            llama_batch b = llama_batch_init(1, 0, 1);
            b.token[0] = best;
            b.pos[0] = n_past++;
            b.n_seq_id[0] = 1;
            b.seq_id[0][0] = 0;
            b.logits[0] = 1;
            b.n_tokens = 1;
            if (llama_decode(lctx, b) != 0) return 11;
            llama_batch_free(b);
        }
        if (gen) fclose(gen);
        llama_free(lctx);
    }
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bmp);
    mtmd_free(ctx);
    llama_model_free(model);
    free(rgb);
    return 0;
}
