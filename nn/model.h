/* The image-text model, as the three networks the pipeline places:
 *
 *   image branch  ResNet (BasicBlocks) -> final feature map flattened to
 *                 tokens (B, Ni, C_last) -> linear to width D: (B, Ni, D)
 *   text branch   token + position embedding -> N pre-LN transformer layers
 *                 (masked self-attention, GELU FFN) -> final LayerNorm: (B, T, D)
 *   fusion        ITC: symmetric InfoNCE between L2-normalised projections of
 *                 the flattened image tokens (all Ni*D values: the spatial
 *                 layout survives, which captions such as "left of" need) and
 *                 of the text [CLS] token, learnable
 *                 temperature (logit_scale); ITM: L cross-attention layers
 *                 (text queries, image keys/values) over each positive pair and
 *                 one hard negative per sample (the most similar other image by
 *                 ITC similarity), a linear head on [CLS], BCE. loss = ITC + ITM.
 *                 The fusion layers have no text self-attention, so only the
 *                 [CLS] row reaches the loss and only it is computed.
 *
 * Each branch is a sequence of numbered layers so that a pipeline can cut it
 * into sub-stages by layer range [first, last); the single-process trainer
 * uses the whole range. Parameter names are global ("image.layer3.conv1.weight")
 * and initialisation is per name, so any cut holds the same numbers.
 *
 * Saved activations live in an `acts` object per micro-batch in flight; a
 * network holds only parameters, so a stage may run several micro-batches'
 * forwards before their backwards (GPipe, 1F1B). Backward accumulates into the
 * parameter gradients (micro-batch accumulation) and writes (+=) the input
 * gradient when asked.
 *
 * Devices: a network computes on the backend it was created on
 * (kernels/backend.h; *_create uses the CPU backend, *_create_on takes one),
 * and its parameters, gradients, optimizer state and saved activations are
 * that backend's memory. The tensor arguments of forward, backward and embed
 * (in, out, ids, mask, dout, din, img, txt, dimg, dtxt, img_emb, txt_emb) are
 * memory of the same backend; loss parts come back as host values. Ops do not
 * report errors one by one: after a step, mmp_backend_error() on the backend
 * says whether one failed (the CPU backend never does). */
#ifndef MMP_NN_MODEL_H
#define MMP_NN_MODEL_H

#include <stdint.h>

#include "common/config.h"
#include "common/err.h"
#include "kernels/backend.h"
#include "nn/params.h"

/* ---- image branch --------------------------------------------------------- */
typedef struct mmp_image_net mmp_image_net;
typedef struct mmp_image_acts mmp_image_acts;

/* Layers of the image branch for this plan (stem, each BasicBlock, projection). */
int mmp_image_net_layers(const mmp_plan *plan);
/* Tokens per image Ni and their width before projection, for this plan. */
int mmp_image_net_tokens(const mmp_plan *plan);

/* Builds layers [first, last) with their parameters initialised from seed. */
mmp_err mmp_image_net_create(mmp_image_net **out, const mmp_plan *plan, int first, int last,
                             uint64_t seed);
mmp_err mmp_image_net_create_on(mmp_image_net **out, mmp_backend *be, const mmp_plan *plan,
                                int first, int last, uint64_t seed);
void mmp_image_net_destroy(mmp_image_net *net);
mmp_params *mmp_image_net_params(mmp_image_net *net);
struct mmp_wgrad;
/* Floats per sample of this range's input and output activation
 * (input of layer 0: 3*S*S image; output of the last layer: Ni*D tokens). */
int64_t mmp_image_net_in_floats(const mmp_image_net *net);
int64_t mmp_image_net_out_floats(const mmp_image_net *net);

mmp_err mmp_image_acts_create(mmp_image_acts **out, mmp_image_net *net, int max_batch);
void mmp_image_acts_destroy(mmp_image_acts *a);

/* in (B, in_floats), out (B, out_floats). train: batch statistics + running
 * statistics update; otherwise running statistics. B <= max_batch of acts. */
void mmp_image_net_forward(mmp_image_net *net, mmp_image_acts *acts, const float *in, int B,
                           int train, float *out);
/* dout (B, out_floats); din (B, in_floats) += when non-NULL. Uses acts of the
 * matching forward (which must have been train = 1). */
void mmp_image_net_backward(mmp_image_net *net, mmp_image_acts *acts, const float *dout, int B,
                            float *din);
/* The same backward split in two (zero-bubble schedules, nn/wgrad.h): _input
 * computes din and every gradient but the conv/linear weights', whose work
 * it records in wg (acts must then live until _weights ran); _weights runs
 * it into the gradient sums. Together bitwise the fused backward, between
 * the same mmp_params_mb_begin/_mb_end around _input. */
void mmp_image_net_backward_input(mmp_image_net *net, mmp_image_acts *acts, const float *dout,
                                  int B, float *din, struct mmp_wgrad *wg);
mmp_err mmp_image_net_backward_weights(mmp_image_net *net, struct mmp_wgrad *wg);

/* Batch-norm statistics of replicas. Replicas of an image sub-stage see
 * different micro-batches, so updating running statistics in place would make
 * them differ from each other and from one process. Instead each replica
 * records, per micro-batch, every batch-norm layer's batch mean and unbiased
 * variance (one row), the rows are gathered across replicas, and every
 * replica replays the running-statistics update in micro-batch order: the
 * same arithmetic as an in-place update, so the result is bitwise what one
 * process computes.
 *
 * mmp_image_net_bn_row_floats: floats in one row (2 x channels summed over
 * this range's batch-norm layers; 0 when it has none). Layout: for each
 * batch-norm layer in parameter order, mean[C] then var[C].
 * Rows are HOST memory on every backend.
 * mmp_image_net_bn_log: while row is non-NULL, training forwards write their
 * statistics into row (overwriting it) and leave the running statistics
 * untouched; NULL restores in-place updates (the default).
 * mmp_image_net_bn_replay: applies the momentum update
 * r = (1 - momentum) r + momentum x of rows[0], rows[1], ... rows[n-1] (each
 * bn_row_floats long) to the running statistics, in that order. */
int64_t mmp_image_net_bn_row_floats(const mmp_image_net *net);
void mmp_image_net_bn_log(mmp_image_net *net, float *row);
void mmp_image_net_bn_replay(mmp_image_net *net, const float *rows, int n);

/* ---- text branch ---------------------------------------------------------- */
typedef struct mmp_text_net mmp_text_net;
typedef struct mmp_text_acts mmp_text_acts;

/* Layers: embedding, each transformer layer, final LayerNorm. */
int mmp_text_net_layers(const mmp_plan *plan);
mmp_err mmp_text_net_create(mmp_text_net **out, const mmp_plan *plan, int vocab_size, int first,
                            int last, uint64_t seed);
mmp_err mmp_text_net_create_on(mmp_text_net **out, mmp_backend *be, const mmp_plan *plan,
                               int vocab_size, int first, int last, uint64_t seed);
void mmp_text_net_destroy(mmp_text_net *net);
mmp_params *mmp_text_net_params(mmp_text_net *net);
/* Activation floats per sample: T*D between layers (layer 0's input is ids). */
int64_t mmp_text_net_out_floats(const mmp_text_net *net);

mmp_err mmp_text_acts_create(mmp_text_acts **out, mmp_text_net *net, int max_batch);
void mmp_text_acts_destroy(mmp_text_acts *a);

/* When first == 0 the input is ids (B,T) and in is ignored; otherwise in is
 * (B,T,D) from the previous sub-stage and ids is ignored. mask (B,T) 1/0 is
 * always given. out (B,T,D). */
void mmp_text_net_forward(mmp_text_net *net, mmp_text_acts *acts, const int32_t *ids,
                          const float *in, const float *mask, int B, float *out);
void mmp_text_net_backward(mmp_text_net *net, mmp_text_acts *acts, const float *dout, int B,
                           float *din);
/* As mmp_image_net_backward_input / _weights (linear layers' weights in W). */
void mmp_text_net_backward_input(mmp_text_net *net, mmp_text_acts *acts, const float *dout, int B,
                                 float *din, struct mmp_wgrad *wg);
mmp_err mmp_text_net_backward_weights(mmp_text_net *net, struct mmp_wgrad *wg);

/* ---- fusion / loss -------------------------------------------------------- */
typedef struct mmp_fusion_net mmp_fusion_net;
typedef struct mmp_fusion_acts mmp_fusion_acts;

typedef struct mmp_loss_parts {
    float loss, itc, itm; /* unweighted means over this micro-batch */
} mmp_loss_parts;

mmp_err mmp_fusion_net_create(mmp_fusion_net **out, const mmp_plan *plan, uint64_t seed);
mmp_err mmp_fusion_net_create_on(mmp_fusion_net **out, mmp_backend *be, const mmp_plan *plan,
                                 uint64_t seed);
void mmp_fusion_net_destroy(mmp_fusion_net *net);
mmp_params *mmp_fusion_net_params(mmp_fusion_net *net);

mmp_err mmp_fusion_acts_create(mmp_fusion_acts **out, mmp_fusion_net *net, int max_batch);
void mmp_fusion_acts_destroy(mmp_fusion_acts *a);

/* img (B,Ni,D), txt (B,T,D), mask (B,T). Computes the loss parts. */
void mmp_fusion_net_forward(mmp_fusion_net *net, mmp_fusion_acts *acts, const float *img,
                            const float *txt, const float *mask, int B, mmp_loss_parts *parts);
/* Backward of weight * loss (weight = this micro-batch's share of the batch's
 * samples): parameter grads +=, dimg (B,Ni,D) +=, dtxt (B,T,D) +=. */
void mmp_fusion_net_backward(mmp_fusion_net *net, mmp_fusion_acts *acts, float weight, float *dimg,
                             float *dtxt);
/* zb-h1 (nn/wgrad.h): while wg is attached (NULL detaches), backwards
 * record the linear layers' weight gradients in wg instead of computing
 * them; _weights then runs them into the gradient sums. */
void mmp_fusion_net_defer(mmp_fusion_net *net, struct mmp_wgrad *wg);
mmp_err mmp_fusion_net_backward_weights(mmp_fusion_net *net, struct mmp_wgrad *wg);

/* Retrieval embeddings (no grad): img_emb (B,E), txt_emb (B,E), L2-normalised,
 * the same vectors ITC compares. E = mmp_fusion_embed_dim(). */
int mmp_fusion_embed_dim(const mmp_fusion_net *net);
void mmp_fusion_net_embed(mmp_fusion_net *net, mmp_fusion_acts *acts, const float *img,
                          const float *txt, const float *mask, int B, float *img_emb,
                          float *txt_emb);

/* Retrieval recall@1 both ways over n pairs of HOST embeddings (n,E): pair i is a
 * hit when its own partner scores strictly above every other candidate
 * (ties count against the model). mmp_retrieval_r1_blocked (nn/retrieval.h)
 * with its default blocks: O(n) memory, never the n x n matrix. */
mmp_err mmp_retrieval_r1(const float *img_emb, const float *txt_emb, int n, int E, double *i2t,
                         double *t2i);

#endif
